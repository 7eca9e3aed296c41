"""A stage's data as a blend: from a blend file, an inline blend, a prefix list or a tier mix."""

from __future__ import annotations

import os

from longctx.data.blend import Blend, BlendEntry, blend_from_prefixes, parse_blend, read_data_args
from longctx.data.check import DataReport, check_datasets
from longctx.errors import StageError
from longctx.plan.coverage_check import coverage_findings
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.split_check import Backend, split_findings
from longctx.plan.stage_artifact import StageDataReport, stage_data_report, stage_tier_blend
from longctx.tokenizer import EncodingSpec
from longctx.tokenizer.load import LoadedTokenizer, load_tokenizer


def stage_blend(rp: ResolvedPlan, st: ResolvedStage) -> Blend:
    """The blend a stage trains on (paths absolute, existence not checked)."""
    d = st.data
    if d is None:
        return parse_blend([], source=f"stage {st.name}")
    if d.blend_file is not None:
        return read_data_args(d.blend_file, check_exists=False)
    if d.blend is not None:
        entries = [BlendEntry(str(p), w) for w, p in d.blend]
        return Blend(entries, True, f"stage {st.name} data.blend")
    if d.prefixes is not None:
        return blend_from_prefixes(list(d.prefixes), check_exists=False)
    return stage_tier_blend(rp, st)


def plan_encoding_spec(rp: ResolvedPlan) -> EncodingSpec | None:
    """How the plan's tokenizer encodes: `tokenizer.megatron_type` (else the manifest's type), with the
    options of the manifest's pinned encoding, else the defaults of the plan's Megatron-LM release; None
    when neither is known (the layout's type applies)."""
    return rp.tokenizer.encoding()


def plan_tokenizer(rp: ResolvedPlan) -> LoadedTokenizer:
    """The plan's tokenizer, encoding as the plan declares (see `plan_encoding_spec`)."""
    return load_tokenizer(rp.tokenizer.path, spec=plan_encoding_spec(rp))


def data_needs(rp: ResolvedPlan) -> tuple[list[int], dict[str, int]]:
    """What the plan asks of its data: every stage's sequence length, and by stage name the tokens it
    trains on (iterations × tokens per iteration), the length and budget `check_plan_data` checks it against."""
    return [st.seq_length for st in rp.stages], {st.name: st.tokens_realized for st in rp.stages}


def check_plan_data(
    rp: ResolvedPlan,
    *,
    tokenizer: LoadedTokenizer | str | os.PathLike[str] | None = None,
    scan: bool = True,
    strict: bool = False,
) -> dict[str, DataReport | StageDataReport]:
    """Run the data checks of every stage against its own length and token budget; a tokenizer given as
    a path encodes as the plan declares, so the datasets' encoding fingerprints are compared with it."""
    if tokenizer is not None and not isinstance(tokenizer, LoadedTokenizer):
        tokenizer = load_tokenizer(tokenizer, spec=plan_encoding_spec(rp))
    out: dict[str, DataReport | StageDataReport] = {}
    for st in rp.stages:
        if st.data is not None and st.data.tier_mix is not None:
            # an artifact: checked once per stage at its length, with how many sequences the blend supplies
            report = stage_data_report(rp, st, tokenizer=tokenizer, scan=scan, strict=strict)
            blend = stage_blend(rp, st)
            # the artifact's chunks are split one by one too: a small one can leave a part empty
            report.findings.extend(split_findings(rp, st, blend, backend=None))
            report.findings.extend(coverage_findings(rp, st, blend))
            out[st.name] = report
            continue
        blend = stage_blend(rp, st)
        report = check_datasets(
            blend,
            tokenizer=tokenizer,
            lengths=[st.seq_length],
            budgets={st.name: st.tokens_realized},  # this stage's share of `data_needs`
            strict=strict,
            scan=scan,
        )
        report.findings.extend(split_findings(rp, st, blend, backend=None))
        report.findings.extend(coverage_findings(rp, st, blend))
        out[st.name] = report
    return out


def require_startable(rp: ResolvedPlan, st: ResolvedStage, backend: Backend) -> None:
    """Refuse a launch that megatron-core or Megatron-LM would stop (or hang) at start-up because of the
    stage's split and data (longctx.plan.split_check), before anything starts."""
    if st.data is None:
        return
    # an artifact's chunks too: megatron-core splits each chunk of the tier blend on its own
    errors = split_findings(rp, st, stage_blend(rp, st), backend).errors
    if errors:
        first = errors[0]
        raise StageError(first.message, where=first.where, fix=first.fix)
