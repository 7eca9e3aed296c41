"""Which stage of the plan a checkpoint belongs to, and so its RoPE base and window.

`rope_theta` and `max_position_embeddings` of the exported config are the stage's (the plan's base
for the base model), never copied from the base model: a 128K stage exported with the base's 4K
window and base would load, run and be worse beyond 4K. The stage is `--stage`, else the stage the
local trainer recorded in the saved args (`longctx_stage`), else the stage whose save dir holds the
checkpoint. The saved `rotary_base`, when there is one, must equal the stage's: the weights were
trained with it. So must the saved RoPE kind: a YaRN stage (Megatron-LM ≥ 0.19 saves
`position_embedding_type = "yarn"` and the YaRN settings) exports YaRN, a base-only stage plain RoPE, and
each saved YaRN setting must be the stage's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longctx.errors import ExportError
from longctx.plan.derive import ResolvedPlan
from longctx.rope.scaling import RopeScaling

BASE = "base"


@dataclasses.dataclass(frozen=True)
class StageChoice:
    name: str  # a stage of the plan, or "base"
    rotary_base: int
    max_position_embeddings: int
    seq_length: int
    source: str  # how it was chosen: "--stage", "saved args", "checkpoint path"
    rope_scaling: RopeScaling | None = None  # the stage's YaRN (None: the base alone)


def _names(rp: ResolvedPlan) -> list[str]:
    return [BASE, *(s.name for s in rp.stages)]


def _by_name(rp: ResolvedPlan, name: str, source: str) -> StageChoice:
    if name == BASE:
        base = rp.base
        return StageChoice(BASE, int(base.rotary_base), int(base.seq_length), int(base.seq_length), source)
    for st in rp.stages:
        if st.name == name:
            return StageChoice(
                st.name,
                int(st.rotary_base),
                int(st.max_position_embeddings),
                int(st.seq_length),
                source,
                st.rope_scaling,
            )
    raise ExportError(
        f"plan {rp.name!r} has no stage {name!r}",
        where=rp.where,
        fix=f"use one of: {', '.join(_names(rp))}",
    )


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


def _from_path(rp: ResolvedPlan, checkpoint: Path) -> str | None:
    for st in rp.stages:
        if _inside(checkpoint, st.save_dir):
            return st.name
    if rp.base.path is not None and _inside(checkpoint, rp.base.path):
        return BASE
    return None


def choose_stage(
    rp: ResolvedPlan, checkpoint: Path, args: Mapping[str, Any], stage: str | None
) -> StageChoice:
    """The stage for `checkpoint` (its iteration directory), checked against its saved rotary base."""
    if stage is not None:
        choice = _by_name(rp, stage, "--stage")
    elif isinstance(args.get("longctx_stage"), str) and args["longctx_stage"] in _names(rp):
        choice = _by_name(rp, args["longctx_stage"], "saved args")
    elif (found := _from_path(rp, checkpoint)) is not None:
        choice = _by_name(rp, found, "checkpoint path")
    else:
        raise ExportError(
            f"cannot tell which stage of plan {rp.name!r} this checkpoint is: its args name no stage of "
            "the plan and it is not in a stage's save dir",
            where=str(checkpoint),
            fix=f"pass --stage with one of: {', '.join(_names(rp))}",
        )
    saved = args.get("rotary_base")
    if saved is not None and int(saved) != choice.rotary_base:
        what = "the plan's base model" if choice.name == BASE else f"stage {choice.name}"
        raise ExportError(
            f"the checkpoint was trained with rotary base {int(saved):,}, but {what} has {choice.rotary_base:,} "
            f"(stage chosen from {choice.source})",
            where=str(checkpoint),
            fix="pass the --stage this checkpoint belongs to (or the plan it was trained with); a config with "
            "another base than the weights were trained with loads, runs and is worse at long context",
        )
    _check_saved_scaling(choice, args, str(checkpoint))
    return choice


# Megatron-LM's saved args of a YaRN model → the stage's value (None in the args: Megatron's default)
def _yarn_values(scaling: RopeScaling) -> dict[str, float]:
    return {
        "rotary_scaling_factor": float(scaling.factor),
        "yarn_original_max_position_embeddings": float(scaling.original_length),
        "yarn_beta_fast": 32.0 if scaling.beta_fast is None else float(scaling.beta_fast),
        "yarn_beta_slow": 1.0 if scaling.beta_slow is None else float(scaling.beta_slow),
        "mscale": 1.0 if scaling.mscale is None else float(scaling.mscale),
        "mscale_all_dim": 0.0 if scaling.mscale_all_dim is None else float(scaling.mscale_all_dim),
    }


def _check_saved_scaling(choice: StageChoice, args: Mapping[str, Any], where: str) -> None:
    """The saved RoPE kind (and YaRN's settings) must be the stage's: weights trained with YaRN exported
    as plain RoPE, or the reverse, load, run and are worse beyond the original length."""
    what = "the plan's base model" if choice.name == BASE else f"stage {choice.name}"
    yarn = choice.rope_scaling is not None and choice.rope_scaling.type == "yarn"
    saved = args.get("position_embedding_type")
    fix = "pass the --stage this checkpoint belongs to (or the plan it was trained with)"
    if saved is not None and saved != ("yarn" if yarn else "rope"):
        planned = "YaRN" if yarn else "plain RoPE"
        raise ExportError(
            f"the checkpoint was trained with position_embedding_type {saved!r}, but {what} plans {planned} "
            f"(stage chosen from {choice.source})",
            where=where,
            fix=fix,
        )
    if not yarn or choice.rope_scaling is None:
        return
    off = [
        f"{k} {args[k]!r} (stage: {v:g})"
        for k, v in _yarn_values(choice.rope_scaling).items()
        if args.get(k) is not None and float(args[k]) != v
    ]
    if args.get("yarn_correction_range_round_to_int") is False:
        off.append("yarn_correction_range_round_to_int False (the export rounds the correction range)")
    if off:
        raise ExportError(
            f"the checkpoint's YaRN settings are not {what}'s: {'; '.join(off)}", where=where, fix=fix
        )


__all__ = ["BASE", "StageChoice", "choose_stage"]
