"""`data check ARTIFACT`: recorded tokenizer vs the model's, per language × tier figures, index-only and full modes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data.artifact.check import check_artifact
from longctx.data.artifact.chunk_layout import open_artifact
from longctx.data.index_scan import read_index_only, scan_index
from longctx.data.indexed import read_index
from longctx.data.scan import ScanParams
from tests.fixtures.artifact import ARTIFACT_RUN, LAYOUT, TOKENIZER_MODEL, chunk_name, copy_artifact
from tests.fixtures.data import write_indexed_dataset

runner = CliRunner()
LENGTHS = [512, 2048]


def _prefix(root: Path, lang: str, tier: str, i: int = 0) -> str:
    return str(root / "runs" / ARTIFACT_RUN / "bin" / f"{chunk_name(lang, tier, i)}_text_document")


def _set_build_info(root: Path, **kw: object) -> None:
    p = root / "manifests" / "build_info.json"
    info = json.loads(p.read_text())
    info.update(kw)
    p.write_text(json.dumps(info))


def _poke(prefix: str, token: int, value: int) -> None:
    """Overwrite one int32 token of a .bin (same size)."""
    arr = np.memmap(prefix + ".bin", dtype=np.int32, mode="r+")
    arr[token] = value
    arr.flush()
    del arr


@pytest.mark.parametrize("index_only", [True, False])
def test_artifact_passes_with_its_tokenizer(
    oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, index_only: bool
) -> None:
    rep = check_artifact(
        oellm_artifact,
        tokenizer=oellm_like_hf_dir,
        manifest=oellm_like_manifest,
        lengths=LENGTHS,
        index_only=index_only,
        progress=False,
        strict=True,
    )
    assert rep.ok, rep.findings.errors
    assert rep.checked == rep.chunks == 11 and rep.dtypes == {"int32": 11}
    assert "build-tokenizer" in rep.findings.codes("info")  # the recorded Hub id is the manifest's name
    assert ("spot" if index_only else "scan") in rep.findings.codes("info")
    # per language × tier figures, recomputed from the indexes
    art = open_artifact(oellm_artifact)
    for g in rep.groups:
        lens = np.concatenate(
            [
                read_index(c.prefix).document_lengths()
                for c in art.chunks
                if (c.language, c.tier) == (g.language, g.tier)
            ]
        )
        assert g.chunks == len(LAYOUT[(g.language, g.tier)]) and g.documents == sum(
            LAYOUT[(g.language, g.tier)]
        )
        assert g.tokens == int(lens.sum()) and g.max_length == int(lens.max())
        for cov, n in zip(g.coverage, LENGTHS, strict=True):
            assert cov.documents_at_least == int((lens >= n).sum())
            assert cov.token_share == pytest.approx(lens[lens >= n].sum() / lens.sum())
    tiers = {t.tier: t for t in rep.tiers}
    assert tiers["under4k"].coverage[0].documents_at_least == 0  # no document reaches 512
    assert (
        tiers["4_16k"].coverage[1].documents_at_least == 0
        and tiers["16k_plus"].coverage[1].documents_at_least > 0
    )
    assert rep.total.documents == sum(sum(v) for v in LAYOUT.values())


def test_cli_table_and_json(oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path) -> None:
    args = [
        "data",
        "check",
        str(oellm_artifact),
        "-t",
        str(oellm_like_hf_dir),
        "--tokenizer-manifest",
        str(oellm_like_manifest),
        "--lengths",
        "512,2K",
        "--index-only",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "data check (index-only): OK" in res.stdout and "16k_plus" in res.stdout and "≥ 2K" in res.stdout
    res = runner.invoke(app, [*args, "--tiers", "under4k", "--languages", "en", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["ok"] and data["chunks"] == 2 and [g["language"] for g in data["groups"]] == ["en"]
    res = runner.invoke(app, [*args, "--tiers", "64_128k"])
    assert res.exit_code == 2 and "tier(s) 64_128k not in the artifact" in res.output


def test_vocabulary_mismatch_in_build_info_is_an_error(
    oellm_artifact: Path, oellm_like_hf_dir: Path, tmp_path: Path
) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    _set_build_info(root, vocab_size=262144)
    rep = check_artifact(root, tokenizer=oellm_like_hf_dir, index_only=True, progress=False)
    err = next(f for f in rep.findings.errors if f.code == "build-vocab")
    assert "vocabulary of 262,144" in err.message and err.expected == 513 and err.found == 262144
    res = runner.invoke(app, ["data", "check", str(root), "-t", str(oellm_like_hf_dir), "--index-only"])
    assert res.exit_code == 2 and "vocabulary of 262,144" in res.stdout


def test_tokenizer_names_in_build_info(
    oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    _set_build_info(root, tokenizer_model="meta-llama/Llama-3.1-8B")
    rep = check_artifact(
        root, tokenizer=oellm_like_hf_dir, manifest=oellm_like_manifest, index_only=True, progress=False
    )
    err = next(f for f in rep.findings.errors if f.code == "build-tokenizer")
    assert "meta-llama/Llama-3.1-8B" in err.message and "oellm-like" in err.message
    # without the manifest the given tokenizer's name is unknown: a warning
    rep = check_artifact(root, tokenizer=oellm_like_hf_dir, index_only=True, progress=False)
    assert rep.ok and "pass its manifest" in next(f.fix for f in rep.findings if f.code == "build-tokenizer")
    # a path of the building machine says little: a warning (an error with --strict)
    _set_build_info(root, tokenizer_model="/flash/project/jouni/converted/oellm-datamix-9b")
    rep = check_artifact(
        root, tokenizer=oellm_like_hf_dir, manifest=oellm_like_manifest, index_only=True, progress=False
    )
    assert rep.ok and "build-tokenizer" in rep.findings.codes("warning")
    rep = check_artifact(
        root,
        tokenizer=oellm_like_hf_dir,
        manifest=oellm_like_manifest,
        index_only=True,
        progress=False,
        strict=True,
    )
    assert not rep.ok
    # another Megatron tokenizer class: a warning, the token-id checks decide
    _set_build_info(root, tokenizer_model=TOKENIZER_MODEL, tokenizer_type="GPT2BPETokenizer")
    rep = check_artifact(
        root, tokenizer=oellm_like_hf_dir, manifest=oellm_like_manifest, index_only=True, progress=False
    )
    assert rep.ok and "build-tokenizer-type" in rep.findings.codes("warning")


def test_wrong_ids_found_by_spot_check_and_full_scan(
    oellm_artifact: Path, oellm_like_hf_dir: Path, tmp_path: Path
) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    p = _prefix(root, "de", "4_16k")
    _poke(p, 5, 70000)  # an id of a larger vocabulary, in the first block
    info = read_index(p)
    _poke(p, int(info.document_lengths()[0]) - 1, 7)  # the first document's EOD replaced
    for index_only, codes in ((True, {"spot-eod", "spot-range"}), (False, {"eod", "token-range"})):
        rep = check_artifact(
            root, tokenizer=oellm_like_hf_dir, tiers=["4_16k"], index_only=index_only, progress=False
        )
        assert codes <= set(rep.findings.codes("error")), rep.findings
        assert all(
            chunk_name("de", "4_16k", 0) in (f.where or "") for f in rep.findings.errors if f.code in codes
        )


def test_dtype_too_small_for_the_vocabulary(oellm_artifact: Path, tmp_path: Path) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    p = _prefix(root, "mt", "under4k")
    write_indexed_dataset(p, [[1, 5, 6, 2], [1, 7, 2]], dtype=np.uint16)
    rep = check_artifact(root, vocab_size=262145, eod_id=2, index_only=True, progress=False)
    err = next(f for f in rep.findings.errors if f.code == "dtype-vocab")
    assert "1 prefixes store tokens as uint16" in err.message and "262,145" in err.message


def test_missing_files_and_index_only_downloads(
    oellm_artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    for c in open_artifact(root).chunks:
        c.bin_path.unlink()  # an --idx-only download
    rep = check_artifact(
        root,
        tokenizer=oellm_like_hf_dir,
        manifest=oellm_like_manifest,
        lengths=LENGTHS,
        index_only=True,
        progress=False,
    )
    assert rep.ok and rep.checked == 11 and "index-only-download" in rep.findings.codes("info")
    assert rep.total.documents == sum(sum(v) for v in LAYOUT.values())
    full = check_artifact(root, tokenizer=oellm_like_hf_dir, progress=False)
    err = next(f for f in full.findings.errors if f.code == "not-downloaded")
    assert "11 of 11 selected prefixes have no .bin/.idx" in err.message and "longctx data fetch" in (
        err.fix or ""
    )
    s = scan_index(_prefix(root, "en", "4_16k"), [512], params=ScanParams(513, 2, 1))
    assert s.ok and s.bin_bytes is None and s.spot is None and s.lengths is not None


def test_index_reader_matches_megatron_layout(oellm_artifact: Path) -> None:
    p = _prefix(oellm_artifact, "en", "16k_plus", 1)
    ours, has_bin = read_index_only(p)
    ref = read_index(p)
    assert has_bin and ours.tokens == ref.tokens and ours.documents == ref.documents
    assert np.array_equal(ours.document_lengths(), ref.document_lengths())
    assert np.array_equal(ours.sequence_pointers, ref.sequence_pointers)
