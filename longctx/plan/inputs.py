"""Checks of a plan against the filesystem (run on request: plans are usually written off-cluster)."""

from __future__ import annotations

from longctx.plan import paths
from longctx.plan.derive import ResolvedPlan
from longctx.report import Findings


def check_paths(rp: ResolvedPlan, findings: Findings) -> None:
    plan = rp.plan
    tok = paths.resolve(plan.tokenizer.path, plan, field="tokenizer.path")
    if not tok.exists():
        findings.error(
            "tokenizer-missing",
            f"tokenizer not found: {tok}",
            where="tokenizer.path",
            fix="point tokenizer.path at the tokenizer directory or tokenizer.model",
        )
    if plan.base.path:
        base = paths.resolve(plan.base.path, plan, field="base.path")
        if not base.exists():
            findings.error(
                "base-missing",
                f"base checkpoint not found: {base}",
                where="base.path",
                fix="run `longctx ckpt fetch` / `longctx ckpt adopt`, or fix base.path",
            )
