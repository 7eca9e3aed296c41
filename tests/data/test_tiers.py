"""Tier mixes: the weights (tiers × tempered languages × chunk bytes), the stage's data-args file, supply per stage."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data.artifact.chunk_layout import open_artifact
from longctx.data.artifact.tiers import blend_supply, tempered_weights, tier_blend, weight_text
from longctx.data.blend import parse_blend, read_data_args
from longctx.data.indexed import read_index
from longctx.errors import DatasetError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.stage_artifact import stage_blend_file, stage_blend_notes, stage_supply
from longctx.plan.stage_data import stage_blend
from tests.fixtures.artifact import ARTIFACT_RUN, copy_artifact
from tests.fixtures.run import ARCH

runner = CliRunner()
MIX = {"16k_plus": 0.75, "4_16k": 0.15, "under4k": 0.10}


def _plan(
    path: Path, artifact: Path | str, hf_dir: Path, manifest: Path, *, s512_tokens: int = 16 * 512 * 4
) -> Path:
    arch = "\n".join(f"{k} = {v}" for k, v in ARCH.items())
    path.write_text(
        textwrap.dedent(f"""\
        name = "tiers"
        run_dir = "{path.parent / "run"}"
        [base]
        path = "${{RUN_DIR}}/base"
        seq_length = 256
        rotary_base = 10000
        [tokenizer]
        path = "{hf_dir}"
        manifest = "{manifest}"
        [model]
        """)
        + arch
        + textwrap.dedent(f"""
        [cluster]
        profile = "local"
        gpus_per_node = 1
        gpu_memory_gib = 8
        [defaults]
        nodes = 1
        tensor_parallel = 1
        context_parallel = 1
        global_batch_size = 4
        [defaults.data.tier_mix]
        artifact = "${{LONGCTX_TEST_ARTIFACT:-{artifact}}}"
        run = "{ARTIFACT_RUN}"
        tiers = {{ "16k_plus" = 0.75, "4_16k" = 0.15, "under4k" = 0.10 }}
        alpha = 0.3
        floor = 0.05
        [[stages]]
        name = "s512"
        seq_length = 512
        tokens = {s512_tokens}
        rope = {{ base = 20000 }}
        [[stages]]
        name = "s2k"
        seq_length = 2048
        tokens = {8 * 2048 * 4}
        rope = {{ base = 80000 }}
        [stages.data.tier_mix]
        artifact = "{artifact}"
        run = "{ARTIFACT_RUN}"
        tiers = {{ "16k_plus" = 0.9, "4_16k" = 0.07, "under4k" = 0.03 }}
        languages = ["en", "de"]
        alpha = 0.3
        [[stages]]
        name = "s4k"
        seq_length = 4096
        tokens = {4 * 4096 * 4}
        rope = {{ base = 160000 }}
        """)
    )
    return path


@pytest.fixture
def plan_file(
    tmp_path: Path, oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> Path:
    return _plan(tmp_path / "plan.toml", oellm_artifact, oellm_like_hf_dir, oellm_like_manifest)


# -- the mix rule ---------------------------------------------------------------------------------------------
def test_tempered_weights() -> None:
    sizes = {"en": 800.0, "de": 150.0, "mt": 50.0}
    assert tempered_weights(sizes, None) == pytest.approx({"en": 0.8, "de": 0.15, "mt": 0.05})
    assert tempered_weights(sizes, 1e-9) == pytest.approx({k: 1 / 3 for k in sizes}, rel=1e-6)
    raw = {k: (v / 1000) ** 0.3 for k, v in sizes.items()}
    expected = {k: v / sum(raw.values()) for k, v in raw.items()}
    assert tempered_weights(sizes, 0.3) == pytest.approx(expected)
    # the floor lifts the smallest, then everything is renormalised
    w = tempered_weights(sizes, None, floor=0.1)
    assert w == pytest.approx({"en": 0.8 / 1.05, "de": 0.15 / 1.05, "mt": 0.1 / 1.05})
    assert sum(w.values()) == pytest.approx(1.0)
    assert tempered_weights({"a": 0, "b": 5}, 0.3) == {"b": 1.0}  # empty languages are left out


def test_tier_blend_weights(oellm_artifact: Path) -> None:
    art = open_artifact(oellm_artifact)
    tb = tier_blend(art, MIX, alpha=0.3, floor=0.05)
    assert sum(w for _, w in tb.entries) == pytest.approx(1.0)
    assert len(tb.entries) == len(art.chunks) and not tb.manifest_only
    for tier, tw in MIX.items():
        in_tier = [(c, w) for c, w in tb.entries if c.tier == tier]
        assert sum(w for _, w in in_tier) == pytest.approx(tw)
        sizes: dict[str, int] = {}
        for c in art.chunks:
            if c.tier == tier:
                sizes[c.language] = sizes.get(c.language, 0) + c.bin_bytes  # type: ignore[index,operator]
        lang_w = tempered_weights(sizes, 0.3, 0.05)
        for lang, lw in lang_w.items():
            chunks = [(c, w) for c, w in in_tier if c.language == lang]
            assert sum(w for _, w in chunks) == pytest.approx(tw * lw)
            for c, w in chunks:  # a language's chunks share its weight by bytes
                assert w == pytest.approx(tw * lw * c.bin_bytes / sizes[lang])  # type: ignore[operator]
    # tempering lifts the small language above its natural share
    t16 = tb.tiers[0]
    nat = t16.language_bytes["mt"] / t16.bin_bytes
    assert t16.languages["mt"] > nat and t16.languages["en"] < t16.language_bytes["en"] / t16.bin_bytes
    # the data-args text parses back exactly, with plain decimals
    text = tb.data_args_text()
    assert "e-" not in text and "E" not in text.replace("_text_document", "")
    parsed = parse_blend(text, check_exists=True)
    assert parsed.ok and [e.weight for e in parsed.entries] == [w for _, w in tb.entries]
    assert weight_text(1.875e-05) == "0.00001875" and weight_text(0.5) == "0.5"


def test_tier_blend_selection_and_errors(oellm_artifact: Path) -> None:
    art = open_artifact(oellm_artifact)
    tb = tier_blend(art, {"16k_plus": 3, "under4k": 1, "4_16k": 0}, languages=["en", "mt"])
    assert {c.language for c, _ in tb.entries} == {"en", "mt"} and {c.tier for c, _ in tb.entries} == {
        "16k_plus",
        "under4k",
    }
    assert [t.weight for t in tb.tiers] == pytest.approx([0.75, 0.25])
    assert "tier-zero" in tb.findings.codes("info")
    with pytest.raises(DatasetError, match=r"tier.*64_128k not in the artifact"):
        tier_blend(art, {"64_128k": 1.0})
    with pytest.raises(DatasetError, match="non-negative"):
        tier_blend(art, {"16k_plus": -1.0})
    with pytest.raises(DatasetError, match="every tier weight is zero"):
        tier_blend(art, {"16k_plus": 0.0})
    with pytest.raises(DatasetError, match=r"language.*fi not in the artifact"):
        tier_blend(art, MIX, languages=["fi"])


def test_blend_from_manifests_alone(oellm_artifact: Path, tmp_path: Path) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "manifests-only")
    for c in open_artifact(root).chunks:
        c.bin_path.unlink()
        c.idx_path.unlink()
    full = tier_blend(open_artifact(oellm_artifact), MIX, alpha=0.3, floor=0.05)
    bare = tier_blend(open_artifact(root), MIX, alpha=0.3, floor=0.05)
    assert [(c.name, w) for c, w in bare.entries] == [(c.name, w) for c, w in full.entries]
    assert bare.manifest_only and bare.missing_bin == bare.missing_idx == 11
    warn = next(f for f in bare.findings if f.code == "manifest-only")
    assert "11 of 11 prefixes" in warn.message and "longctx data fetch" in (warn.fix or "")


# -- plans ----------------------------------------------------------------------------------------------------
def test_stage_blend_and_data_args_file(plan_file: Path, oellm_artifact: Path) -> None:
    rp = resolve_plan(load_plan(plan_file))
    st = rp.stage("s512")
    blend = stage_blend(rp, st)
    assert blend.weighted and blend.ok and len(blend.entries) == 11
    assert all(
        e.prefix.startswith(str(oellm_artifact / "runs" / ARTIFACT_RUN / "bin")) for e in blend.entries
    )
    path = stage_blend_file(rp, st)
    assert path == rp.run_dir / "stages" / "s512" / "data_args.txt"
    parsed = read_data_args(path)
    assert parsed.ok and [(e.prefix, e.weight) for e in parsed.entries] == [
        (e.prefix, e.weight) for e in blend.entries
    ]
    assert (path.parent / "data_args.json").is_file()
    mtime = path.stat().st_mtime_ns
    assert (
        stage_blend_file(rp, st) == path and path.stat().st_mtime_ns == mtime
    )  # unchanged content, untouched
    # the 2K stage's own mix: two languages, its tier weights
    s2k = stage_blend(rp, rp.stage("s2k"))
    assert {Path(e.prefix).name.split("_")[3] for e in s2k.entries} == {"en", "de"}
    res = runner.invoke(app, ["stage", "args", str(plan_file), "s512"])
    assert res.exit_code == 0, res.output
    assert f"--data-args-path {path}" in res.stdout.splitlines()


def test_stage_args_from_manifests_only(
    tmp_path: Path, oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "bare")
    for c in open_artifact(root).chunks:
        c.bin_path.unlink()
        c.idx_path.unlink()
    plan = _plan(tmp_path / "plan.toml", root, oellm_like_hf_dir, oellm_like_manifest)
    res = runner.invoke(app, ["stage", "args", str(plan), "s512"])
    assert res.exit_code == 0, res.output
    rp = resolve_plan(load_plan(plan))
    notes = stage_blend_notes(rp, rp.stage("s512"))
    assert len(notes) == 1 and "not downloaded" in notes[0]


def test_absent_artifact_names_the_fetch(
    tmp_path: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path / "plan.toml", tmp_path / "no-artifact", oellm_like_hf_dir, oellm_like_manifest)
    monkeypatch.delenv("LONGCTX_TEST_ARTIFACT", raising=False)
    res = runner.invoke(app, ["stage", "args", str(plan), "s512"])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "the tier mix's artifact is not here" in out and "longctx data fetch" in out
    assert f"--run {ARTIFACT_RUN}" in out and "export LONGCTX_TEST_ARTIFACT=DIR" in out
    rp = resolve_plan(load_plan(plan))
    with pytest.raises(DatasetError, match="artifact is not here"):
        stage_blend(rp, rp.stage("s512"))


# -- supply ----------------------------------------------------------------------------------------------------
def _lengths_by_tier(art_root: Path) -> dict[str, list[np.ndarray]]:
    out: dict[str, list[np.ndarray]] = {}
    for c in open_artifact(art_root).chunks:
        lengths = read_index(c.prefix).document_lengths()  # type: ignore[arg-type]
        out.setdefault(c.tier, []).append(np.asarray(lengths, dtype=np.int64))
    return out


def test_supply_per_stage(plan_file: Path, oellm_artifact: Path) -> None:
    rp = resolve_plan(load_plan(plan_file))
    by_tier = _lengths_by_tier(oellm_artifact)
    rep = stage_supply(rp, rp.stage("s512"))
    assert rep.basis == "index" and rep.sequences_needed == rp.stage("s512").tokens_realized // 512
    for t in rep.tiers:
        lens = by_tier[t.tier]
        assert t.packed_sequences == sum((int(x.sum()) - 1) // 512 for x in lens)
        assert t.documents_at_least == sum(int((x >= 512).sum()) for x in lens)
        assert t.single_document_sequences == sum(int((x // 512).sum()) for x in lens)
        assert t.longest_document == max(int(x.max()) for x in lens)
    short = {f.message.split()[1] for f in rep.findings if f.code == "tier-short"}
    assert short == {"under4k"}
    assert rep.findings.ok and "supply" in rep.findings.codes("info")
    s2k = stage_supply(rp, rp.stage("s2k"))
    assert {f.message.split()[1] for f in s2k.findings if f.code == "tier-short"} == {"4_16k", "under4k"}
    assert all(
        f.level == "info" for f in s2k.findings if f.code == "tier-short"
    )  # 10 % of the stage: by design
    s4k = stage_supply(rp, rp.stage("s4k"))
    err = next(f for f in s4k.findings.errors if f.code == "supply-none")
    assert "no tier of the blend holds a document of 4K tokens" in err.message
    warn = next(f for f in s4k.findings if f.code == "tier-short" and "16k_plus" in f.message)
    assert warn.level == "warning"  # 75 % of the stage cannot be native 4K documents


def test_supply_warns_when_the_budget_repeats_data(
    tmp_path: Path, oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    plan = _plan(
        tmp_path / "plan.toml",
        oellm_artifact,
        oellm_like_hf_dir,
        oellm_like_manifest,
        s512_tokens=400 * 512 * 4,
    )
    rp = resolve_plan(load_plan(plan))
    rep = stage_supply(rp, rp.stage("s512"))
    assert rep.sequences_without_repeat is not None and rep.sequences_without_repeat < rep.sequences_needed
    warn = next(f for f in rep.findings if f.code == "supply-epochs")
    assert "repeats data" in warn.message and "mt in" in warn.message  # the upsampled small language


def test_supply_from_manifests_and_bounds(oellm_artifact: Path, tmp_path: Path) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "bare")
    for c in open_artifact(root).chunks:
        c.bin_path.unlink()
        c.idx_path.unlink()
    tb = tier_blend(open_artifact(root), MIX, alpha=0.3, floor=0.05)
    rep = blend_supply(tb, stage="s", seq_length=512, tokens=4096)
    assert rep.basis == "manifests" and "supply-estimate" in rep.findings.codes("info")
    tiers = {t.tier: t for t in rep.tiers}
    assert tiers["under4k"].can_supply is False  # its bounds end below 512
    assert tiers["16k_plus"].can_supply is True  # its bounds start above 512
    assert tiers["4_16k"].can_supply is None and "tier-unknown" in rep.findings.codes("info")
    assert tiers["16k_plus"].tokens == sum(
        c.bin_bytes // 4 for c in open_artifact(root).chunks if c.tier == "16k_plus"
    )  # type: ignore[operator]
    rep2k = blend_supply(tb, stage="s", seq_length=2048, tokens=4096)
    assert {t.tier: t.can_supply for t in rep2k.tiers} == {"16k_plus": None, "4_16k": False, "under4k": False}
    assert os.path.isdir(root)


def test_stage_data_report(
    plan_file: Path, oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    from longctx.plan.stage_artifact import stage_data_report

    rp = resolve_plan(load_plan(plan_file))
    reports = {
        st.name: stage_data_report(rp, st, tokenizer=oellm_like_hf_dir, progress=False) for st in rp.stages
    }
    assert reports["s512"].ok and reports["s2k"].ok and not reports["s4k"].ok  # nothing reaches 4K
    assert reports["s512"].artifact is reports["s4k"].artifact  # one check for the stages sharing a mix
    assert reports["s512"].artifact.lengths == [512, 2048, 4096] and reports["s512"].artifact.mode == "full"
    assert reports["s2k"].artifact.chunks == 8  # en and de only
    assert "build-tokenizer" in reports["s512"].all_findings().codes(
        "info"
    )  # named as in the plan's manifest
    assert "supply-none" in reports["s4k"].all_findings().codes("error")
    # the data files are needed here: a manifests-only artifact is an error
    root = copy_artifact(oellm_artifact, tmp_path / "bare")
    for c in open_artifact(root).chunks:
        c.bin_path.unlink()
    bare = resolve_plan(load_plan(_plan(tmp_path / "p2.toml", root, oellm_like_hf_dir, oellm_like_manifest)))
    rep = stage_data_report(bare, bare.stage("s512"), tokenizer=oellm_like_hf_dir, progress=False)
    assert "not-downloaded" in rep.all_findings().codes("error")
    idx = stage_data_report(bare, bare.stage("s512"), tokenizer=oellm_like_hf_dir, scan=False, progress=False)
    assert idx.artifact.mode == "index-only" and "not-downloaded" not in idx.all_findings().codes()
