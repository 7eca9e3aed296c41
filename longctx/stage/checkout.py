"""The plan's `[megatron] version` against the Megatron-LM checkout it will run with, when one is given."""

from __future__ import annotations

from pathlib import Path

from longctx.errors import StageError
from longctx.megatron_versions import parse_version
from longctx.plan.derive import ResolvedPlan
from longctx.stage.megatron_source import checkout_version

# the checkout a megatron-lm launch uses (longctx.stage.run reads the same variable)
MEGATRON_ENV = "LONGCTX_MEGATRON_LM"


def plan_checkout(rp: ResolvedPlan) -> Path | None:
    """The plan's [megatron].path when it names a directory here (a plan written for a cluster is still
    rendered on a machine without its checkout)."""
    root = rp.megatron.path
    return root if root is not None and root.is_dir() else None


def require_checkout_version(rp: ResolvedPlan, root: Path | None = None) -> None:
    """StageError naming both versions when the checkout's release line (major.minor: what the release
    table distinguishes) differs from `[megatron] version`. `root`: the checkout a launch or preflight
    runs (${MEGATRON_ENV} or [megatron].path); None: the plan's own [megatron].path, if present here."""
    root = root if root is not None else plan_checkout(rp)
    if root is None:
        return
    found, source = checkout_version(root)
    declared = rp.megatron.version
    if parse_version(found)[:2] != parse_version(declared)[:2]:
        raise StageError(
            f"the plan says Megatron-LM {declared} ([megatron] version) but the checkout {root} is {found} "
            f"(read from {source}); flags, tokenizer defaults and checkpoint layout differ between them",
            where=f"{rp.where}: [megatron].version",
            fix=f'set [megatron] version = "{found}", or point [megatron].path / ${MEGATRON_ENV} at a '
            f"{declared} checkout",
        )


__all__ = ["MEGATRON_ENV", "plan_checkout", "require_checkout_version"]
