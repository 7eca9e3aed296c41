"""A stage's `split` against its data, as megatron-core will build it at start-up (both backends build
their datasets with megatron-core's BlendedMegatronDatasetBuilder).

- A part with a share that holds no document of some dataset: megatron-core loops forever building it
  (`GPTDataset._get_num_epochs`), on either backend.
- Megatron-LM only: with no evaluation (`eval_iters = 0`) pretrain_gpt.py still builds a loader for every
  validation and test part with a share, asking it for 0 samples. A weighted blend then yields an empty
  dataset, an unweighted one a single pass over the part; an empty one stops Megatron-LM at start-up
  (`AssertionError: no sample to consume: 0` in its sampler), after the queue wait on a cluster.
- A blend that draws a dataset more often than megatron-core built it for (`longctx.plan.blend_draws`):
  `IndexError: The valid blend oversamples the contributing datasets` at start-up. The train part on both
  backends; the validation and test parts on Megatron-LM, which builds them whenever they have a share.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from longctx.data.blend import Blend
from longctx.data.indexed import EMPTY_FIX, no_tokens_message, read_index
from longctx.data.split_parts import PART_NAMES, SplitPart, split_parts
from longctx.errors import LongctxError
from longctx.plan.blend_draws import BlendDraw, blend_draw, default_surplus, sufficient_surplus
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.report import Findings

Backend = Literal["local", "megatron-lm"]


def _parts(blend: Blend, split: str) -> dict[str, list[SplitPart]] | None:
    try:
        return {e.prefix: split_parts(read_index(e.prefix), split) for e in blend.entries}
    except LongctxError:
        return None  # an unreadable dataset is the data check's finding, not this one's


def _empty_parts(st: ResolvedStage, split: str, parts: dict[str, list[SplitPart]], out: Findings) -> None:
    for prefix, ps in parts.items():
        for p in ps:
            if p.built and p.documents > 0 and p.tokens == 0:  # an epoch of 0 tokens: the same endless loop
                out.error(
                    "split-empty-part",
                    f"stage {st.name}, split {split!r}: "
                    f"{no_tokens_message(f'{Path(prefix).name} ({p.name} part)', p.documents)}; megatron-core "
                    "would loop forever building that part (GPTDataset._get_num_epochs)",
                    where=prefix,
                    fix=f"{EMPTY_FIX}; or give the {p.name} part a share of 0 so it is not built",
                )
            elif p.built and p.documents == 0:
                n = max(q.end for q in ps)  # the last built part ends at the dataset's last document
                out.error(
                    "split-empty-part",
                    f"stage {st.name}: split {split!r} gives the {p.name} part {p.share:.2%} of "
                    f"{Path(prefix).name}'s {n:,} documents, which rounds to none: megatron-core would loop "
                    "forever building that part (GPTDataset._get_num_epochs)",
                    where=prefix,
                    fix=f"give the {p.name} part a share of at least one document, or 0 so it is not built",
                )


def _no_heldout(
    rp: ResolvedPlan, st: ResolvedStage, split: str, parts: dict[str, list[SplitPart]], out: Findings
) -> None:
    """Evaluation takes its haystacks and loss-by-position documents from what the train part leaves."""
    if any(ps[0].end < max(q.end for q in ps) or not ps[0].built for ps in parts.values()):
        return
    after = " (the stage's own evaluation, [local] eval_after_stage, then fails after training)"
    out.warning(
        "split-no-heldout",
        f"stage {st.name}: split {split!r} gives every document of its data to training, so "
        f"`longctx eval run --stage {st.name}` finds no held-out document to build haystacks from"
        + (after if rp.local.eval_after_stage else ""),
        where=next(iter(parts)),
        fix='give the data a validation share (e.g. split = "98,2,0"), or evaluate on unseen data with '
        "`eval run --data PREFIX`",
    )


def _unevaluated_parts(
    st: ResolvedStage, split: str, blend: Blend, parts: dict[str, list[SplitPart]], level: str, out: Findings
) -> None:
    if st.eval_iters > 0:
        return
    for i, name in enumerate(("train", "valid", "test")):
        if i == 0 or not any(ps[i].built for ps in parts.values()):
            continue
        if blend.weighted and len(blend.entries) > 1:
            samples, why = 0, "a weighted blend asked for 0 samples is empty"
        else:
            samples = sum(ps[i].samples_in_one_epoch(st.seq_length) for ps in parts.values())
            why = f"one pass over its {sum(ps[i].tokens for ps in parts.values()):,} tokens"
        if samples > 0:
            continue
        docs = sum(ps[i].documents for ps in parts.values())
        getattr(out, level)(
            "split-no-eval-samples",
            f"stage {st.name}: on Megatron-LM, eval_iters = 0 still builds a loader for the {name} part of "
            f"split {split!r} ({docs:,} documents), and it gets 0 samples of {st.seq_length:,} tokens ({why}): "
            "pretrain_gpt.py stops at start-up (AssertionError: no sample to consume: 0)",
            where=f"stage {st.name}",
            fix=f"set eval_iters >= 1 (and eval_interval) for this stage, so Megatron-LM evaluates on the {name} "
            "part, or give that part a share of 0 in the split",
        )


SURPLUS_FLAG = "--mid-level-dataset-surplus"


def _surplus_text(rp: ResolvedPlan, st: ResolvedStage) -> str | None:
    """The stage's --mid-level-dataset-surplus on Megatron-LM (its argparse keeps the last one given):
    extra_args come after [megatron].performance_args in the launch."""
    words = [*rp.megatron.performance_args, *st.extra_args]
    value = None
    for i, w in enumerate(words):
        if w == SURPLUS_FLAG and i + 1 < len(words):
            value = words[i + 1]
        elif w.startswith(SURPLUS_FLAG + "="):
            value = w.split("=", 1)[1]
    return value


def _surplus(rp: ResolvedPlan, st: ResolvedStage, backend: Backend, out: Findings) -> float | None:
    """What megatron-core builds with: the local trainer leaves its default; None: a value Megatron-LM
    cannot use (reported)."""
    text = _surplus_text(rp, st) if backend == "megatron-lm" else None
    if text is None:
        return default_surplus()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value >= 0:
        return value
    out.error(
        "blend-surplus",
        f"stage {st.name}: {SURPLUS_FLAG} {text!r} is not a number >= 0: megatron-core sizes every dataset of "
        "the blend by it",
        where=f"stage {st.name}: extra_args",
        fix=f"give {SURPLUS_FLAG} a decimal number >= 0 (megatron-core's default is {default_surplus()})",
    )
    return None


def requested_samples(st: ResolvedStage, backend: Backend) -> tuple[tuple[int, str], ...]:
    """(samples, how) the trainer asks of the train, valid and test parts: train_iters × global batch on
    both backends; on Megatron-LM also its evaluation (get_train_valid_test_num_samples), with the flags
    the argv builder gives (no eval_interval: eval_iters 0); the local trainer builds the train part only."""
    gbs, iters = st.global_batch_size, st.train_iters
    train = (iters * gbs, f"train_iters × global batch = {iters:,} × {gbs:,}")
    if backend == "local":
        return train, (0, ""), (0, "")
    eval_iters = st.eval_iters if st.eval_interval else 0
    interval = st.eval_interval or iters + 1
    valid = (iters // interval + 1) * eval_iters * gbs
    how = (
        f"(train_iters // eval_interval + 1) × eval_iters × global batch = ({iters:,} // {interval:,} + 1) × "
    )
    return (
        train,
        (valid, f"{how}{eval_iters} × {gbs:,}"),
        (eval_iters * gbs, f"eval_iters × global batch = {eval_iters} × {gbs:,}"),
    )


def _draws(
    st: ResolvedStage, blend: Blend, parts: list[list[SplitPart]], backend: Backend, surplus: float, seen: set
) -> list[tuple[int, BlendDraw]]:
    """The parts whose blend draws a dataset beyond its length, each part and surplus drawn once."""
    weights = [e.weight or 0.0 for e in blend.entries] if blend.weighted else None
    found = []
    for i, (n, _) in enumerate(requested_samples(st, backend)):
        key = (i, n, surplus)
        if key in seen or not parts[0][i].built:
            continue
        seen.add(key)
        draw = blend_draw(weights, [ps[i].tokens for ps in parts], st.seq_length, n, surplus)
        if draw is not None and draw.oversampled:
            found.append((i, draw))
    return found


def _oversampled_parts(
    rp: ResolvedPlan,
    st: ResolvedStage,
    split: str,
    blend: Blend,
    parts: dict[str, list[SplitPart]],
    view: tuple[Backend, str],
    seen: set,
) -> Findings:
    out = Findings()
    backend, level = view
    if len(blend.entries) < 2:  # one dataset alone is never drawn beyond its target
        return out
    surplus = _surplus(rp, st, backend, out)
    if surplus is None:
        return out
    by_entry = [parts[e.prefix] for e in blend.entries]
    draws = _draws(st, blend, by_entry, backend, surplus, seen)
    if not draws:
        return out
    fix = _oversample_fix(st, split, blend, by_entry, backend, draws)
    for i, draw in draws:
        name, (n, how) = PART_NAMES[i], requested_samples(st, backend)[i]
        bad = draw.oversampled
        said = "; ".join(_oversample_detail(blend, by_entry, i, draw, k, st.seq_length) for k in bad[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        getattr(out, level)(
            "blend-oversampled",
            f"stage {st.name}, split {split!r}, on {backend}: megatron-core would stop at start-up building the "
            f"{name} blend ({n:,} sample{'s' if n != 1 else ''} asked, {how}; the blend drawn {draw.size:,}): "
            f"it draws {said}{more} "
            f"(IndexError: The {name} blend oversamples the contributing datasets, in "
            "BlendedDataset._build_indices)",
            where=blend.entries[bad[0]].prefix,
            fix=fix,
        )
    return out


def _oversample_detail(
    blend: Blend, parts: list[list[SplitPart]], i: int, draw: BlendDraw, k: int, s: int
) -> str:
    p = parts[k][i]
    built = f", built for {draw.targets[k]:,}" if draw.targets[k] is not None else ", one epoch"
    return (
        f"{draw.drawn[k]:,} samples of {s:,} tokens from {Path(blend.entries[k].prefix).name} "
        f"({p.name} part: {p.documents:,} documents, {p.tokens:,} tokens), which makes {draw.lengths[k]:,}{built}"
    )


def _oversample_fix(
    st: ResolvedStage,
    split: str,
    blend: Blend,
    parts: list[list[SplitPart]],
    backend: Backend,
    draws: list[tuple[int, BlendDraw]],
) -> str:
    names = " and ".join(PART_NAMES[i] for i, _ in draws)
    share = f"give the {names} part{'s' if len(draws) > 1 else ''} a larger share of split {split!r}"
    more = "a larger global batch" + (" or more eval_iters" if any(i > 0 for i, _ in draws) else "")
    if not blend.weighted:  # the surplus sizes weighted blends only: each prefix is built for one epoch
        return f"{share}, or weight the blend (then --mid-level-dataset-surplus sizes each dataset)"
    if backend == "local":
        return (
            f"{share}, or ask it for more samples ({more}); the local trainer builds with megatron-core's "
            f"default surplus {default_surplus()}"
        )
    weights = [e.weight or 0.0 for e in blend.entries]
    need = max(
        sufficient_surplus(weights, [ps[i].tokens for ps in parts], st.seq_length, draw) for i, draw in draws
    )
    return (
        f'add "{SURPLUS_FLAG}", "{need:g}" to the stage\'s extra_args (megatron-core then builds each dataset '
        f"for ceil(ceil(N·w)·(1 + {need:g})) samples, enough for every draw); or {more}, so the blend asks "
        f"for more samples; or {share}"
    )


def split_findings(rp: ResolvedPlan, st: ResolvedStage, blend: Blend, backend: Backend | None) -> Findings:
    """What the stage's split does at start-up on `backend`; None (plan check): on the backend the plan's
    [slurm] table declares, else as `_views` says."""
    out = Findings()
    split = st.data.split if st.data is not None else None
    if not split or not blend.entries:
        return out
    parts = _parts(blend, split)
    if parts is None:
        return out
    _empty_parts(st, split, parts, out)
    _no_heldout(rp, st, split, parts, out)
    seen: set = set()
    for view, level in _views(rp, backend):
        if view == "megatron-lm":
            _unevaluated_parts(st, split, blend, parts, level, out)
        out.extend(_oversampled_parts(rp, st, split, blend, parts, (view, level), seen))
    return out


def _views(rp: ResolvedPlan, backend: Backend | None) -> list[tuple[Backend, str]]:
    """The backends a stage's start-up is checked for, each with the level of what it finds. Plan check
    (None): the backend the plan's [slurm] declares (a rehearsal's plan does); else Megatron-LM's failures
    are errors in a plan that names its Megatron-LM ([megatron]), and in one that does not the local
    trainer's are, Megatron-LM's only warnings."""
    backend = backend or rp.slurm.backend
    if backend is not None:
        return [(backend, "error")]
    if "megatron" in rp.plan.model_fields_set:
        return [("megatron-lm", "error")]
    return [("local", "error"), ("megatron-lm", "warning")]


__all__ = ["split_findings"]
