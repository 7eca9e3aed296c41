"""Tokenized artifacts: layout and names, fetch/adopt rewriting the mix, checksum verification, re-fetch, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data.artifact.chunk_layout import open_artifact, parse_prefix_name
from longctx.data.artifact.fetch import fetch_artifact, verify_artifact
from longctx.data.blend import read_data_args
from longctx.errors import DatasetError
from tests.fixtures.artifact import (
    ARTIFACT_RUN,
    LAYOUT,
    OTHER_MACHINE,
    artifact_repo_files,
    chunk_name,
    copy_artifact,
)

runner = CliRunner()
REPO = "test-org/oellm-longctx-test"


def _bin_rel(lang: str, tier: str, i: int = 0) -> str:
    return f"runs/{ARTIFACT_RUN}/bin/{chunk_name(lang, tier, i)}_text_document.bin"


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# -- layout and names -----------------------------------------------------------------------------------------
def test_open_reads_manifests(oellm_artifact: Path) -> None:
    art = open_artifact(oellm_artifact)
    assert art.run == ARTIFACT_RUN and art.run_root == oellm_artifact / "runs" / ARTIFACT_RUN
    assert len(art.chunks) == sum(len(v) for v in LAYOUT.values())
    assert art.languages == ["de", "en", "mt"]
    assert art.tier_names == ["16k_plus", "4_16k", "under4k"]  # longest first
    assert art.tiers["4_16k"].min == 256 and art.tiers["4_16k"].max == 1024  # the artifact's own bounds
    c = next(c for c in art.chunks if c.name == chunk_name("en", "16k_plus", 1))
    assert (c.language, c.tier, c.documents) == ("en", "16k_plus", LAYOUT[("en", "16k_plus")][1])
    assert c.prefix == str(art.bin_dir / f"{c.name}_text_document") and c.has_bin and c.has_idx
    assert (
        c.bin_bytes == c.bin_path.stat().st_size
        and c.bin_sha256
        and c.described_by.endswith(f"{c.name}.json")
    )
    assert art.build_info is not None and art.build_info.vocab_size == 512
    assert (
        art.checksums[_bin_rel("en", "16k_plus")].sha256
        == next(x for x in art.chunks if x.name == chunk_name("en", "16k_plus", 0)).bin_sha256
    )
    assert art.findings == []


@pytest.mark.parametrize(
    ("name", "run", "expected"),
    [
        (f"{ARTIFACT_RUN}_en_s0003_c00012_16k_plus_text_document", ARTIFACT_RUN, ("en", "16k_plus")),
        ("lc16k_full_20260507_de_s0000_c00000_4_16k_text_document", None, ("de", "4_16k")),
        ("/x/bin/fi_s0001_c00002_under4k_text_document", None, ("fi", "under4k")),
        ("multilingual_16k_plus_text_document", None, ("multilingual", "16k_plus")),
        ("en_64_128k_text_document", None, ("en", "64_128k")),
        ("en_128k_plus", None, ("en", "128k_plus")),
        ("sv_128_256k_text_document", None, ("sv", "128_256k")),
        ("bg_text_document", None, ("bg", None)),
        ("16_32k_text_document", None, (None, "16_32k")),
    ],
)
def test_prefix_names(name: str, run: str | None, expected: tuple[str | None, str | None]) -> None:
    assert parse_prefix_name(name, run=run) == expected


def test_unknown_languages_tiers_runs_are_named(oellm_artifact: Path, tmp_path: Path) -> None:
    art = open_artifact(oellm_artifact)
    with pytest.raises(DatasetError, match=r"language.*xx not in the artifact") as e:
        art.select(["en", "xx"])
    assert "de, en, mt" in (e.value.fix or "")
    with pytest.raises(DatasetError, match=r"tier.*64_128k not in the artifact") as e:
        art.select(tiers=["64_128k"])
    assert "16k_plus, 4_16k, under4k" in (e.value.fix or "")
    with pytest.raises(DatasetError, match="run 'other' is not in the artifact") as e:
        open_artifact(oellm_artifact, run="other")
    assert ARTIFACT_RUN in (e.value.fix or "")
    two = copy_artifact(oellm_artifact, tmp_path / "two")
    (two / "runs" / "second_run" / "bin").mkdir(parents=True)
    with pytest.raises(DatasetError, match="holds 2 runs") as e:
        open_artifact(two)
    assert "second_run" in (e.value.fix or "")
    with pytest.raises(DatasetError, match="artifact directory not found") as e:
        open_artifact(tmp_path / "nothing")
    assert "longctx data fetch" in (e.value.fix or "")


# -- offline adoption: verify and rewrite the mix ---------------------------------------------------------------
def test_offline_adopt_rewrites_mix_to_local_paths(oellm_artifact: Path, tmp_path: Path) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "adopted")
    original_args = (root / "mix" / "data_path.args").read_text()
    assert OTHER_MACHINE in original_args
    r = fetch_artifact(REPO, root, offline=True, progress=False)
    assert r.ok, r.findings.errors
    assert r.verify is not None and r.verify.ok and r.verify.bytes_hashed > 0
    rewritten = sorted(r.rewrite.files)  # type: ignore[union-attr]
    assert rewritten == ["mix/data_mix.json", "mix/data_mix.txt", "mix/data_path.args"]
    bin_dir = root / "runs" / ARTIFACT_RUN / "bin"
    blend = read_data_args(root / "mix" / "data_path.args")  # every prefix exists here
    assert blend.ok and blend.weighted and len(blend.entries) == 11
    assert all(e.prefix.startswith(str(bin_dir) + "/") for e in blend.entries)
    # the weights are kept word for word
    new_words, old_words = (root / "mix" / "data_path.args").read_text().split(), original_args.split()
    assert new_words[::2] == old_words[::2]
    mix = json.loads((root / "mix" / "data_mix.json").read_text())
    assert mix["bin_dir"] == str(bin_dir)
    assert all(e["prefix"].startswith(str(bin_dir)) for e in mix["languages"].values())
    assert mix["data_path_args"].split()[1::2] == new_words[1::2]
    txt = (root / "mix" / "data_mix.txt").read_text()
    assert OTHER_MACHINE not in txt and f"# bin_dir = {bin_dir}" in txt
    # the downloaded originals are kept (and still verify); a second adoption changes nothing
    assert (root / ".longctx" / "original" / "mix" / "data_path.args").read_text() == original_args
    again = fetch_artifact(REPO, root, offline=True, progress=False)
    assert again.ok and again.rewrite is not None and again.rewrite.files == []
    assert again.verify is not None and again.verify.cached >= 30 and again.verify.bytes_hashed == 0
    res = runner.invoke(app, ["data", "fetch", REPO, "--into", str(root), "--offline"])
    assert res.exit_code == 0, res.output
    assert "data fetch: OK" in res.stdout and "offline: adopted" in res.stdout


def test_offline_without_download_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="offline, and nothing was downloaded") as e:
        fetch_artifact(REPO, tmp_path / "absent", offline=True, progress=False)
    assert f"longctx data fetch {REPO}" in (e.value.fix or "")


# -- checksum verification ----------------------------------------------------------------------------------------
def test_corruption_truncation_and_loss_are_named(oellm_artifact: Path, tmp_path: Path) -> None:
    root = copy_artifact(oellm_artifact, tmp_path / "bad")
    _flip_byte(root / _bin_rel("de", "4_16k"))
    idx = root / _bin_rel("en", "under4k", 1).replace(".bin", ".idx")
    idx.write_bytes(idx.read_bytes()[:-8])
    (root / _bin_rel("mt", "16k_plus")).unlink()
    r = fetch_artifact(REPO, root, offline=True, progress=False)
    assert not r.ok
    bad = {b.rel: b.status for b in r.verify.bad}  # type: ignore[union-attr]
    assert bad == {
        _bin_rel("de", "4_16k"): "sha256",
        _bin_rel("en", "under4k", 1).replace(".bin", ".idx"): "size",
        _bin_rel("mt", "16k_plus"): "missing",
    }
    sha = next(f for f in r.findings if f.code == "sha256")
    assert chunk_name("de", "4_16k", 0) in sha.message and "corrupt" in sha.message
    summary = next(f for f in r.findings if f.code == "verify")
    assert "3 file(s) failed verification" in summary.message and "re-download" in (summary.fix or "")
    res = runner.invoke(app, ["data", "fetch", REPO, "--into", str(root), "--offline"])
    assert res.exit_code == 2
    assert chunk_name("de", "4_16k", 0) in res.stdout and "sha256" in res.stdout


def test_remembered_hashes_and_recheck(oellm_artifact: Path, tmp_path: Path) -> None:
    """Hashes are remembered per (size, mtime): a change that keeps both is found by a recheck."""
    root = copy_artifact(oellm_artifact, tmp_path / "cache")
    art = open_artifact(root)
    assert verify_artifact(art, progress=False).ok
    target = root / _bin_rel("en", "4_16k")
    st = target.stat()
    _flip_byte(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert verify_artifact(art, progress=False).ok  # the remembered hash stands
    rechecked = verify_artifact(art, progress=False, use_cache=False)
    assert [b.rel for b in rechecked.bad] == [_bin_rel("en", "4_16k")]


# -- download through the Hub's API (only the transport is faked) -----------------------------------------------
def test_fetch_selection_verify_refetch_and_resume(
    oellm_artifact: Path, tmp_path: Path, fake_dataset_hub
) -> None:
    hub = fake_dataset_hub({REPO: artifact_repo_files(oellm_artifact)})
    into = tmp_path / "dl"
    hub.fail_once.add(_bin_rel("de", "16k_plus"))  # the connection breaks mid-file
    with pytest.raises(DatasetError, match="download interrupted") as e:
        fetch_artifact(REPO, into, languages=["de", "mt"], tiers=["16k_plus", "under4k"], progress=False)
    assert "run the same command again" in (e.value.fix or "")
    finished = {p.relative_to(into).as_posix() for p in (into / "runs").rglob("*") if p.is_file()}
    assert finished and _bin_rel("de", "16k_plus") not in finished
    hub.requests.clear()
    r = fetch_artifact(REPO, into, languages=["de", "mt"], tiers=["16k_plus", "under4k"], progress=False)
    assert r.ok, r.findings.errors
    assert r.commit == hub.commits[REPO] and r.chunks == 4 and r.languages == ["de", "mt"]
    again = {
        u.split("/resolve/", 1)[1].split("/", 1)[1]
        for m, u, _ in hub.requests
        if m == "GET" and "/resolve/" in u
    }
    assert _bin_rel("de", "16k_plus") in again and not (
        again & finished
    )  # finished files are not fetched again
    got = sorted(p.name for p in (into / "runs" / ARTIFACT_RUN / "bin").iterdir())
    assert got == sorted(
        f"{chunk_name(lang, tier, 0)}_text_document.{ext}"
        for lang in ("de", "mt")
        for tier in ("16k_plus", "under4k")
        for ext in ("bin", "idx")
    )
    assert r.rewrite is not None and r.rewrite.prefixes == 11 and r.rewrite.local == 4
    assert any(f.code == "mix-local" for f in r.findings)
    # a corrupted file is found, deleted and fetched again
    target = into / _bin_rel("mt", "under4k")
    good = target.read_bytes()
    _flip_byte(target, 10)
    again = fetch_artifact(REPO, into, languages=["de", "mt"], tiers=["16k_plus", "under4k"], progress=False)
    assert again.ok and again.refetched == [_bin_rel("mt", "under4k")]
    assert target.read_bytes() == good
    # a damaged original of a rewritten mix file: fetched afresh and rewritten again
    saved = into / ".longctx" / "original" / "mix" / "data_path.args"
    saved.write_text("0.5 /elsewhere/x_text_document 0.5 /elsewhere/y_text_document\n")
    third = fetch_artifact(REPO, into, languages=["de", "mt"], tiers=["16k_plus", "under4k"], progress=False)
    assert third.ok and third.refetched == ["mix/data_path.args"]
    assert (
        OTHER_MACHINE in saved.read_text()
        and read_data_args(into / "mix" / "data_path.args", check_exists=False).ok
    )
    assert str(into) in (into / "mix" / "data_path.args").read_text()


def test_fetch_manifests_only_and_idx_only(oellm_artifact: Path, tmp_path: Path, fake_dataset_hub) -> None:
    fake_dataset_hub({REPO: artifact_repo_files(oellm_artifact)})
    m = fetch_artifact(REPO, tmp_path / "m", run=ARTIFACT_RUN, content="manifests", progress=False)
    assert m.ok and m.chunks == 11
    assert not (tmp_path / "m" / "runs" / ARTIFACT_RUN / "bin").exists()
    assert len(list((tmp_path / "m" / "runs" / ARTIFACT_RUN / "manifests" / "chunks").iterdir())) == 11
    i = fetch_artifact(REPO, tmp_path / "i", tiers=["16k_plus"], content="idx", progress=False)
    assert i.ok
    files = sorted(p.suffix for p in (tmp_path / "i" / "runs" / ARTIFACT_RUN / "bin").iterdir())
    assert files == [".idx"] * 4


def test_unreachable_repo_is_a_dataset_error(tmp_path: Path, fake_dataset_hub) -> None:
    fake_dataset_hub({})
    with pytest.raises(DatasetError, match="cannot be read"):
        fetch_artifact("nobody/nothing", tmp_path / "x", progress=False)


def test_stale_download_is_rebuilt_cleanly(oellm_artifact: Path, tmp_path: Path) -> None:
    """A mix file downloaded again (not longctx's output) becomes the new original before the rewrite."""
    root = copy_artifact(oellm_artifact, tmp_path / "a")
    assert fetch_artifact(REPO, root, offline=True, progress=False).ok
    fresh = (root / ".longctx" / "original" / "mix" / "data_path.args").read_text()
    (root / "mix" / "data_path.args").write_text(fresh)  # as huggingface_hub restores a changed file
    r = fetch_artifact(REPO, root, offline=True, progress=False)
    assert r.ok and r.rewrite is not None and r.rewrite.files == ["mix/data_path.args"]
    assert OTHER_MACHINE not in (root / "mix" / "data_path.args").read_text()


def test_fetch_cli(oellm_artifact: Path, tmp_path: Path, fake_dataset_hub) -> None:
    fake_dataset_hub({REPO: artifact_repo_files(oellm_artifact)})
    into = tmp_path / "cli"
    res = runner.invoke(app, ["data", "fetch", REPO, "--into", str(into), "--manifests-only", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (
        data["ok"] and data["chunks"] == 11 and data["content"] == "manifests" and data["run"] == ARTIFACT_RUN
    )
    res = runner.invoke(
        app, ["data", "fetch", REPO, "--into", str(into), "--languages", "mt", "--tiers", "under4k"]
    )
    assert res.exit_code == 0, res.output
    assert "data fetch: OK" in res.stdout and "1 prefixes (all)" in res.stdout
    res = runner.invoke(app, ["data", "fetch", REPO, "--into", str(into), "--manifests-only", "--idx-only"])
    assert res.exit_code == 2 and "at most one of --manifests-only and --idx-only" in res.output
    res = runner.invoke(app, ["data", "fetch", REPO, "--into", str(into), "--languages", "xx"])
    assert res.exit_code == 2 and "language(s) xx not in the artifact" in res.output


def test_fields_of_the_wrong_type_are_named_and_read_as_absent(oellm_artifact: Path, tmp_path: Path) -> None:
    """The producer's manifests are evidence: a field of the wrong type is a warning naming the field and
    the file, read as absent, and the rest of the manifest still counts."""
    art_dir = copy_artifact(oellm_artifact, tmp_path / "art")
    name = chunk_name("en", "16k_plus", 1)
    chunk = art_dir / "runs" / ARTIFACT_RUN / "manifests" / "chunks" / f"{name}.json"
    raw = json.loads(chunk.read_text())
    raw.update(bin_sha256="xyz", docs=[1], source_token_count="many")
    chunk.write_text(json.dumps(raw))
    sums_path = art_dir / "manifests" / "checksums.json"
    sums = json.loads(sums_path.read_text())
    sums[_bin_rel("en", "16k_plus")]["bytes"] = "lots"
    sums_path.write_text(json.dumps(sums))
    info_path = art_dir / "manifests" / "build_info.json"
    info = json.loads(info_path.read_text())
    info["vocab_size"] = {"n": 512}
    info_path.write_text(json.dumps(info))
    mix_path = art_dir / "mix" / "data_mix.json"
    mix = json.loads(mix_path.read_text())
    mix["tiers"]["4_16k"]["weight"] = "heavy"
    mix_path.write_text(json.dumps(mix))

    art = open_artifact(art_dir)
    warned = {(f.message.split()[0], f.where) for f in art.findings if f.code == "manifest-field"}
    chunk_rel = chunk.relative_to(art_dir).as_posix()
    assert warned == {
        ("bin_sha256", chunk_rel),
        ("docs", chunk_rel),
        ("source_token_count", chunk_rel),
        ("bytes", f"manifests/checksums.json: {_bin_rel('en', '16k_plus')}"),
        ("vocab_size", "manifests/build_info.json"),
        ("weight", "mix/data_mix.json: tiers.4_16k"),
    }, art.findings
    c = next(c for c in art.chunks if c.name == name)
    assert c.described_by == chunk_rel and c.bin_bytes == c.bin_path.stat().st_size  # the rest kept
    assert (c.bin_sha256, c.documents, c.source_tokens) == (None, None, None) and c.idx_sha256
    assert art.checksums[_bin_rel("en", "16k_plus")].bytes is None
    assert art.build_info is not None and art.build_info.vocab_size is None
    assert art.tiers["4_16k"].weight is None and art.tiers["4_16k"].min == 256
