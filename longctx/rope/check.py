"""The verdict of `longctx rope check`: does one rotary base hold at one context length?

    from longctx.rope.check import check_base
    result = check_base(1_000_000, 128, 65_536)
    result.ok            # False: below Men's bound 2,091,624 for 65,536 tokens (an error finding)
    result.verdict       # "below the bound"

Below Men's bound is an error here (elsewhere, e.g. in `choose_base`, the same diagnosis is a
warning); small cos-sum dips above the bound are reported but pass; a base below the pretraining base
is a warning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longctx.errors import RopeError
from longctx.report import Findings
from longctx.rope.checkpoint_args import RopeModelArgs
from longctx.rope.diagnostics import RopeDiagnostics, diagnose
from longctx.rope.methods import add_diagnostic_findings

#: the men-safe multiple a passing base is compared with (an info finding when below it)
SAFE_FACTOR = 4.0


@dataclasses.dataclass(frozen=True)
class RopeFacts:
    """The model's RoPE facts a check or a suggestion starts from; explicit values beat a checkpoint's."""

    rotary_dim: int
    head_dim: int | None
    pretrain_base: int | None
    pretrain_length: int | None


@dataclasses.dataclass(frozen=True)
class RopeCheck:
    """One base at one length: the diagnostics, the findings they imply, and the verdict."""

    base: int
    rotary_dim: int
    head_dim: int | None
    length: int
    diagnostics: RopeDiagnostics
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok

    @property
    def passes(self) -> bool:
        return self.diagnostics.passes_bound

    @property
    def verdict(self) -> str:
        return "passes" if self.passes else "below the bound"

    def to_json(self) -> dict[str, Any]:
        """`rope check --json`: ok, every diagnostic field, the margin and the findings."""
        diag = self.diagnostics
        fields = {f.name: getattr(diag, f.name) for f in dataclasses.fields(diag)}
        return {"ok": self.ok, **fields, "margin": diag.margin, "findings": self.findings}


def resolve_inputs(
    checkpoint: RopeModelArgs | None,
    *,
    rotary_dim: int | None,
    head_dim: int | None,
    base: int | None,
    length: int | None,
    base_option: str,
    length_option: str,
    need_pretrain: bool,
) -> RopeFacts:
    """Explicit options beat the checkpoint's saved args; the option names go into the messages."""
    ck = checkpoint
    dim = rotary_dim if rotary_dim is not None else (ck.rotary_dim if ck else None)
    hd = head_dim if head_dim is not None else (ck.partial_head_dim if ck and rotary_dim is None else None)
    b = base if base is not None else (ck.base if ck else None)
    n = length if length is not None else (ck.length if ck else None)
    if dim is None:
        raise RopeError(
            "the rotary dim is not known",
            fix="pass --rotary-dim (kv_channels × rotary_percent) or --from-checkpoint",
        )
    if need_pretrain and (b is None or n is None):
        missing = " and ".join(x for x, v in ((base_option, b), (length_option, n)) if v is None)
        raise RopeError(f"{missing} not given", fix=f"pass {missing}, or --from-checkpoint CKPT")
    return RopeFacts(dim, hd, b, n)


def check_base(
    base: int | None,
    rotary_dim: int,
    length: int | None,
    *,
    head_dim: int | None = None,
    pretrain_base: int | None = None,
    pretrain_length: int | None = None,
    search_cap: int | None = None,
) -> RopeCheck:
    """Diagnose `base` at `length` and decide: an error below Men's bound, a warning below the
    pretraining base. Raises RopeError when the base or the length is not known."""
    if base is None:
        raise RopeError(
            "no base to check", fix="pass --base (or --from-checkpoint to check the checkpoint's)"
        )
    if length is None:
        raise RopeError("no length to check the base for", fix="pass --length, e.g. --length 32768")
    diag = diagnose(
        base,
        rotary_dim,
        length,
        head_dim=head_dim,
        pretrain_base=pretrain_base,
        pretrain_length=pretrain_length,
        search_cap=search_cap,
    )
    findings = Findings()
    if pretrain_base is not None and base < pretrain_base:
        findings.warning(
            "base-below-pretrain",
            f"base {base:,} is below the pretraining base {pretrain_base:,}; a lower base shortens every wavelength",
            expected=f">= {pretrain_base:,}",
            found=base,
            fix="raise the base or keep the pretraining base",
        )
    add_diagnostic_findings(findings, diag, safe_factor=SAFE_FACTOR)
    if not diag.passes_bound:  # the check's verdict: below the bound is an error here
        for f in findings:
            if f.code == "below-men-bound":
                f.level = "error"
    return RopeCheck(base, rotary_dim, head_dim, length, diag, findings)
