"""Checks of a plan against the filesystem (run on request: plans are usually written off-cluster)."""

from __future__ import annotations

from longctx.plan.derive import ResolvedPlan
from longctx.report import Findings


def check_paths(rp: ResolvedPlan, findings: Findings) -> None:
    tok = rp.tokenizer.path
    if not tok.exists():
        findings.error(
            "tokenizer-missing",
            f"tokenizer not found: {tok}",
            where="tokenizer.path",
            fix="point tokenizer.path at the tokenizer directory or tokenizer.model",
        )
    if rp.base.path is not None:
        base = rp.base.path
        if not base.exists():
            findings.error(
                "base-missing",
                f"base checkpoint not found: {base}",
                where="base.path",
                fix="run `longctx ckpt fetch` / `longctx ckpt adopt`, or fix base.path",
            )
