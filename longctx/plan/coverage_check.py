"""A stage's distance coverage (longctx.data.coverage) as `plan check --check-data` reports it: the share
of training tokens that see the top of the window, and a warning when no training window reaches it."""

from __future__ import annotations

from pathlib import Path

from longctx.data.blend import Blend, BlendEntry
from longctx.data.coverage import TOP_FRACTION, distance_coverage
from longctx.data.indexed import read_index
from longctx.errors import LongctxError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.report import Findings

# the top of the window trained less than this share of what whole windows give is a warning: the demo's
# MDM at RoPE base 28M read 8 % of keys at 4,096 with its 4K stage at 3 % of that, 67 % at 38 %
SPARSE = 0.25


def coverage_findings(rp: ResolvedPlan, st: ResolvedStage, blend: Blend) -> Findings:
    out = Findings()
    if st.data is None or not blend.entries:
        return out
    try:
        infos = [read_index(e.prefix) for e in blend.entries]
    except LongctxError:
        return out  # an unreadable dataset is the data check's finding
    weights = [
        e.weight if e.weight is not None else float(i.tokens)
        for e, i in zip(blend.entries, infos, strict=True)
    ]
    try:
        cov = distance_coverage(
            [i.document_lengths() for i in infos],
            weights,
            st.seq_length,
            packing=st.data.packing,
            causal=rp.objective.causal,
            names=[e.prefix for e in blend.entries],
        )
    except LongctxError as err:  # a dataset without a token: no window to measure
        out.error("distance-coverage", f"stage {st.name}: {err.what}", where=err.where, fix=err.fix)
        return out
    if st.data.packing != "documents":
        out.info(
            "distance-coverage",
            f"stage {st.name}: attention across documents: every window trains the distances 0 … "
            f"{st.seq_length - 1:,}, whatever the documents' lengths ({100 * cov.top_share:.1f} % of the tokens "
            f"see one ≥ {cov.top_edge:,}; how much of it is one document is the data check's `supply`)",
        )
        return out
    top, edge = cov.top_share, cov.top_edge
    said = (
        f"stage {st.name}: attention within documents: {100 * top:.3f} % of the training tokens see a distance "
        f"≥ {edge:,} (the top 1/{TOP_FRACTION} of the {st.seq_length:,}-token window), "
        f"{100 * cov.share_at(st.seq_length // 2):.1f} % one ≥ {st.seq_length // 2:,}; the longest document piece "
        f"in {cov.windows:,} sampled windows is {cov.longest_piece:,} tokens"
    )
    # what whole windows (concatenation) would give: the last (S − edge) offsets of each window, causal;
    # the outer 2·(S − edge) tokens, bidirectional
    whole = min(1.0, (st.seq_length - edge) * (1 if rp.objective.causal else 2) / st.seq_length)
    where = ", ".join(Path(e.prefix).name for e in blend.entries)
    fix = (
        "add documents longer than the window to the blend (or raise their weight), or evaluate this "
        f"stage at lengths up to {cov.longest_piece:,}"
    )
    seen = top * st.tokens_realized
    if cov.longest_piece < edge:
        out.warning(
            "distance-coverage",
            said + ": no training window shows the model the distances an "
            "evaluation at the full window reads",
            where=where,
            fix=fix,
        )
    elif seen < st.seq_length:
        out.warning(
            "distance-coverage",
            said + f": over the stage's {st.tokens_realized:,} tokens about "
            f"{seen:,.0f} see those distances, less than one window holds",
            where=where,
            fix=fix,
        )
    elif top < SPARSE * whole:
        out.warning(
            "distance-coverage",
            said + f": {top / whole:.1%} of what whole windows would give "
            f"({100 * whole:.2f} %), so an evaluation at the full window meets attention at distances "
            "training barely showed (a RoPE base whose frequencies realign there fails)",
            where=where,
            fix=fix,
        )
    else:
        out.info("distance-coverage", said + f"; about {seen:,.0f} of the stage's tokens see them")
    return out


def datasets_coverage_findings(rp: ResolvedPlan, prefixes: list[str]) -> Findings:
    """`data check PREFIX … --plan PLAN`: the coverage every stage of the plan would get from these datasets
    (size-weighted), with each stage's own packing and the plan's attention."""
    blend = Blend([BlendEntry(p, None) for p in prefixes], weighted=False, source="data check")
    out = Findings()
    for st in rp.stages:
        out.extend(coverage_findings(rp, st, blend))
    return out


__all__ = ["coverage_findings", "datasets_coverage_findings"]
