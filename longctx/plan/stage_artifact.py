"""A plan stage's tokenized artifact: opened from the plan's tier mix, turned into the stage's blend and
Megatron --data-args file, and checked for what the stage needs (supply at its length and budget)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from longctx.data.artifact.check import ArtifactReport, check_artifact
from longctx.data.artifact.chunk_layout import Artifact, open_artifact
from longctx.data.artifact.tiers import (
    DATA_ARGS_FILE,
    DATA_ARGS_INFO,
    SupplyReport,
    TierBlend,
    blend_supply,
    fetch_hint,
    tier_blend,
)
from longctx.data.blend import Blend
from longctx.errors import DatasetError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.schema import TierMix
from longctx.report import Findings
from longctx.tokenizer.load import LoadedTokenizer
from longctx.util.fs import atomic_write_text


# -- the stage's artifact ----------------------------------------------------------------------------------------------
def _tier_mix(rp: ResolvedPlan, st: ResolvedStage) -> TierMix:
    d = st.data
    if d is None or d.tier_mix is None:
        raise DatasetError(f"stage {st.name!r} has no tier mix", where=rp.where)
    return d.tier_mix


def stage_artifact(rp: ResolvedPlan, st: ResolvedStage) -> Artifact:
    """The stage's artifact, opened; a clear DatasetError (with the fetch command) when it is absent."""
    tm = _tier_mix(rp, st)
    root = st.data.artifact  # resolved with the tier mix (`_tier_mix` refused a stage without one)
    if not root.is_dir():
        env = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", tm.artifact)
        point = f"export {env[0]}=DIR" if env else "set the tier mix's artifact path"
        raise DatasetError(
            f"stage {st.name}: the tier mix's artifact is not here: {root}",
            where=rp.where,
            fix=fetch_hint(None, list(tm.tiers), tm.languages, root=root, run=tm.run)
            + " (--manifests-only is enough for `stage args` and planning); "
            + f"or, if it is downloaded elsewhere, {point}",
        )
    return open_artifact(root, run=tm.run)


def stage_tier_blend_info(rp: ResolvedPlan, st: ResolvedStage) -> TierBlend:
    tm = _tier_mix(rp, st)
    art = stage_artifact(rp, st)
    return tier_blend(art, tm.tiers, languages=tm.languages, alpha=tm.alpha, floor=tm.floor)


def stage_tier_blend(rp: ResolvedPlan, st: ResolvedStage) -> Blend:
    """The stage's blend (`longctx.data.blend.Blend`, weighted, absolute local prefixes)."""
    tb = stage_tier_blend_info(rp, st)
    return tb.to_blend(f"stage {st.name} tier mix ({tb.artifact.root})")


def stage_blend_file(rp: ResolvedPlan, st: ResolvedStage) -> Path:
    """Write the stage's blend as a Megatron --data-args-path file under the run dir and return its path.

    `<run_dir>/stages/<stage>/data_args.txt` ('WEIGHT PREFIX' per line), with `data_args.json` beside it
    (tiers, language weights, artifact, whether the data files are here). Both are written atomically,
    and only when their content changes."""
    tb = stage_tier_blend_info(rp, st)
    out_dir = st.stage_dir
    args_path = out_dir / DATA_ARGS_FILE
    info_path = out_dir / DATA_ARGS_INFO
    info = {"stage": st.name, **tb.summary()}
    for path, text in ((args_path, tb.data_args_text()), (info_path, json.dumps(info, indent=2) + "\n")):
        try:
            if not (path.is_file() and path.read_text(encoding="utf-8") == text):
                atomic_write_text(path, text)
        except OSError as err:
            raise DatasetError(
                f"cannot write the stage's data-args file: {err.strerror or err}",
                where=str(path),
                fix="pass --run-dir (or $LONGCTX_RUN_DIR) to a writable directory",
            ) from None
    return args_path


def stage_blend_notes(rp: ResolvedPlan, st: ResolvedStage) -> list[str]:
    """One-line notes worth printing beside the stage's argv (e.g. the data files are not downloaded)."""
    tb = stage_tier_blend_info(rp, st)
    return [f.message for f in tb.findings if f.level != "info"]


def stage_supply(
    rp: ResolvedPlan,
    st: ResolvedStage,
    *,
    use_index: bool = True,
    workers: int | None = None,
    progress: bool = False,
) -> SupplyReport:
    """`blend_supply` for a plan's stage (its tier mix, length and realized token budget)."""
    tb = stage_tier_blend_info(rp, st)
    return blend_supply(
        tb,
        stage=st.name,
        seq_length=st.seq_length,
        tokens=st.tokens_realized,
        use_index=use_index,
        workers=workers,
        progress=progress,
    )


@dataclasses.dataclass
class StageDataReport:
    """`plan check --check-data` for a tier-mix stage: the artifact checked over the blend's chunks
    (recorded tokenizer, structure, ids, lengths per language × tier) and the stage's supply."""

    stage: str
    blend: dict[str, Any]
    artifact: ArtifactReport
    supply: SupplyReport
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def all_findings(self) -> Findings:
        return Findings(self.findings)


_ARTIFACT_CHECKS: dict[tuple[object, ...], ArtifactReport] = {}  # one check per artifact and process


def stage_data_report(
    rp: ResolvedPlan,
    st: ResolvedStage,
    *,
    tokenizer: LoadedTokenizer | str | os.PathLike[str] | None = None,
    scan: bool = True,
    strict: bool = False,
    workers: int | None = None,
    progress: bool = True,
) -> StageDataReport:
    """Check a tier-mix stage's data: `check_artifact` over the chunks its blend uses (the full token
    scan, or index-only with `scan=False`), at every stage length of the plan that uses the same
    artifact (checked once per process), plus `stage_supply`. Missing data files are errors here."""
    tm = _tier_mix(rp, st)
    tb = stage_tier_blend_info(rp, st)
    art = tb.artifact
    tiers = sorted(t for t, w in tm.tiers.items() if w > 0)
    langs = sorted(tm.languages) if tm.languages else None
    same = [
        s.seq_length
        for s in rp.stages
        if s.data is not None
        and s.data.tier_mix is not None
        and s.data.artifact == art.root
        and s.data.tier_mix.run == tm.run
    ]
    lengths = sorted(set(same) | {st.seq_length})
    manifest = rp.tokenizer.manifest_path
    key = (str(art.root), art.run, tuple(tiers), tuple(langs or ()), str(tokenizer), scan, tuple(lengths))
    report = _ARTIFACT_CHECKS.get(key)
    if report is None:
        report = check_artifact(
            art.root,
            run=art.run,
            languages=langs,
            tiers=tiers,
            tokenizer=tokenizer,
            manifest=manifest if manifest.is_file() else None,
            lengths=lengths,
            index_only=not scan,
            workers=workers,
            progress=progress,
        )
        _ARTIFACT_CHECKS[key] = report
    supply = blend_supply(
        tb,
        stage=st.name,
        seq_length=st.seq_length,
        tokens=st.tokens_realized,
        workers=workers,
        progress=False,
    )
    findings = Findings(dataclasses.replace(f) for f in report.findings)  # copies: callers annotate them
    findings.extend(
        f for f in tb.findings if f.code != "manifest-only"
    )  # missing files: reported by the check
    findings.extend(supply.findings)
    if strict:
        findings.escalate_warnings()
    return StageDataReport(st.name, {"stage": st.name, **tb.summary()}, report, supply, findings)
