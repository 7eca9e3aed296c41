"""A stage's `split` against its data, as megatron-core will build it at start-up (both backends build
their datasets with megatron-core's BlendedMegatronDatasetBuilder).

- A part with a share that holds no document of some dataset: megatron-core loops forever building it
  (`GPTDataset._get_num_epochs`), on either backend.
- Megatron-LM only: with no evaluation (`eval_iters = 0`) pretrain_gpt.py still builds a loader for every
  validation and test part with a share, asking it for 0 samples. A weighted blend then yields an empty
  dataset, an unweighted one a single pass over the part; an empty one stops Megatron-LM at start-up
  (`AssertionError: no sample to consume: 0` in its sampler), after the queue wait on a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from longctx.data.blend import Blend
from longctx.data.indexed import EMPTY_FIX, no_tokens_message, read_index
from longctx.data.split_parts import SplitPart, split_parts
from longctx.errors import LongctxError
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


def split_findings(rp: ResolvedPlan, st: ResolvedStage, blend: Blend, backend: Backend | None) -> Findings:
    """What the stage's split does at start-up. `backend` None (plan check): the Megatron-LM rule is an error
    in a plan that names its Megatron-LM ([megatron]) and a warning otherwise."""
    out = Findings()
    split = st.data.split if st.data is not None else None
    if not split or not blend.entries:
        return out
    parts = _parts(blend, split)
    if parts is None:
        return out
    _empty_parts(st, split, parts, out)
    if backend == "megatron-lm" or (backend is None and "megatron" in rp.plan.model_fields_set):
        _unevaluated_parts(st, split, blend, parts, "error", out)
    elif backend is None:
        _unevaluated_parts(st, split, blend, parts, "warning", out)
    return out


__all__ = ["split_findings"]
