"""Tokenizer directories and tokenization outputs that must be refused, and writes onto the inputs."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.artifact import copy_artifact


@pytest.fixture
def tok(oellm_like_hf_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "tok"
    shutil.copytree(oellm_like_hf_dir, d)
    return d


ADDED = {
    "negative-id": ({"<pad>": -1}, "<pad>"),
    "huge-id": ({"<pad>": 10**20}, "<pad>"),
    "float-id": ({"<pad>": 512.5}, "<pad>"),
    "not-an-object": ([512], "added_tokens.json"),
}


@pytest.mark.parametrize("case", sorted(ADDED))
def test_bad_added_tokens(case: str, tok: Path, tmp_path: Path) -> None:
    content, needle = ADDED[case]
    (tok / "added_tokens.json").write_text(json.dumps(content))
    refused(["tokenizer", "fingerprint", tok], [tmp_path], needle=needle)


def test_added_tokens_not_utf8(tok: Path, tmp_path: Path) -> None:
    (tok / "added_tokens.json").write_bytes(b'{"<p\xffd>": 512}')
    refused(["tokenizer", "fingerprint", tok], [tmp_path], needle="added_tokens.json")


def test_tokenizer_config_not_json(tok: Path, tmp_path: Path) -> None:
    (tok / "tokenizer_config.json").write_text("{not json")
    refused(["tokenizer", "fingerprint", tok], [tmp_path], needle="tokenizer_config.json")


def test_truncated_sentencepiece_model(tok: Path, tmp_path: Path) -> None:
    model = tok / "tokenizer.model"
    model.write_bytes(model.read_bytes()[:100])
    refused(["tokenizer", "fingerprint", tok], [tmp_path], needle="tokenizer.model")


def test_fingerprint_write_over_the_tokenizer_model(tok: Path, tmp_path: Path) -> None:
    refused(
        ["tokenizer", "fingerprint", tok, "--write", tok / "tokenizer.model"],
        [tmp_path],
        needle="inside the input",
    )


def test_fingerprint_write_into_the_tokenizer_dir_needs_force(tok: Path, tmp_path: Path) -> None:
    # the manifest beside the files is the usual place, but an existing file is not replaced silently
    (tok / "manifest.toml").write_text("# someone's notes\n")
    refused(["tokenizer", "fingerprint", tok, "--write", tok / "manifest.toml"], [tmp_path], needle="--force")


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(5)) + "\n")
    return p


def test_tokenize_output_into_the_tokenizer(tok: Path, jsonl: Path, tmp_path: Path) -> None:
    refused(["data", "tokenize", jsonl, "-t", tok, "-o", tok / "ds"], [tmp_path], needle="inside the input")


def test_tokenize_output_below_a_file(tok: Path, jsonl: Path, tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("x\n")
    refused(
        ["data", "tokenize", jsonl, "-t", tok, "-o", tmp_path / "blocker" / "ds"],
        [tmp_path],
        needle="blocker",
    )


def test_tokenize_bad_jsonl_line(tok: Path, tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine"}\n{"text": 12}\n')
    refused(["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="bad.jsonl")


def test_tokenize_truncated_gzip(tok: Path, tmp_path: Path) -> None:
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"text": "a whole document"}\n' * 50)[:40])
    refused(["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="truncated")


@pytest.mark.parametrize("prefix", ["", ".", "..", "out/", "out/.."])
def test_tokenize_prefix_that_names_no_file(
    tok: Path, jsonl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty prefix would otherwise write hidden files into the cwd
    refused(["data", "tokenize", jsonl, "-t", tok, "-o", prefix], [tmp_path], needle="names no file")


def test_tokenize_jsonl_not_utf8(tok: Path, tmp_path: Path) -> None:
    p = tmp_path / "latin.jsonl"
    p.write_bytes(b'{"text": "n\xe9ud"}\n')
    refused(
        ["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="latin.jsonl"
    )


@pytest.fixture
def artifact(oellm_artifact: Path, tmp_path: Path) -> Path:
    return copy_artifact(oellm_artifact, tmp_path / "artifact")


@pytest.mark.parametrize(
    ("listing", "entry"),
    [
        ("checksums.json", "../outside.txt"),
        ("checksums.json", "/etc/hostname"),
        ("checksums.sha256", "bin/../../outside.txt"),
    ],
)
def test_checksum_lists_naming_files_outside_the_artifact(
    listing: str, entry: str, artifact: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside.txt").write_text("not the artifact's\n")
    digest = "0" * 64
    path = artifact / "manifests" / listing
    if listing.endswith(".json"):
        sums = json.loads(path.read_text())
        sums[entry] = {"bytes": 19, "sha256": digest}
        path.write_text(json.dumps(sums))
    else:
        path.write_text(path.read_text() + f"{digest}  {entry}\n")
    msg = refused(["data", "check", artifact, "--index-only"], [tmp_path], needle="outside the artifact")
    assert entry in msg, msg


def test_checksum_list_not_utf8(artifact: Path, tmp_path: Path) -> None:
    path = artifact / "manifests" / "checksums.sha256"
    path.write_bytes(path.read_bytes() + b"\xff\xfe  bin/x\n")
    refused(["data", "check", artifact, "--index-only"], [tmp_path], needle="checksums.sha256")


def test_data_check_length_longer_than_any_document(artifact: Path, tmp_path: Path) -> None:
    args = ["data", "check", artifact, "--index-only", "--lengths", "9223372036854775807"]
    refused(args, [tmp_path], needle="longer than any Megatron document")


@pytest.mark.parametrize(
    "content", ["", "\n\n", '{"text": ""}\n'], ids=["empty", "blank-lines", "empty-texts"]
)
def test_tokenize_inputs_without_tokens(tok: Path, tmp_path: Path, content: str) -> None:
    p = tmp_path / "nothing.jsonl"
    p.write_text(content)
    refused(["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="no tokens")


def test_tokenizer_manifest_not_utf8(tok: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "latin.toml"
    manifest.write_bytes(b'name = "n\xe9ud"\n')
    refused(["tokenizer", "check", tok, "--manifest", manifest], [tmp_path], needle="latin.toml")


def test_merges_not_utf8(gpt2_like_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "gpt2"
    shutil.copytree(gpt2_like_dir, d)
    merges = d / "merges.txt"
    merges.write_bytes(merges.read_bytes() + b"\xff \xfe\n")
    refused(["tokenizer", "fingerprint", d], [tmp_path], needle="merges.txt")


def test_tokenize_a_line_beyond_the_bound(tok: Path, tmp_path: Path) -> None:
    p = tmp_path / "long.jsonl"
    p.write_bytes(b'{"text": "fine"}\n{"text": "' + b"a" * (17 << 20) + b'"}\n')
    msg = refused(
        ["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="line 2"
    )
    assert "MiB" in msg


def test_tokenize_a_gzip_bomb_of_blank_lines(tok: Path, tmp_path: Path) -> None:
    p = tmp_path / "blank.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"text": "a document"}\n' + b"\n" * (16 << 20)))
    assert p.stat().st_size < 100_000
    refused(
        ["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"], [tmp_path], needle="decompresses"
    )


def test_a_manifest_whose_encoding_fields_do_not_match_its_digest(tok: Path, tmp_path: Path) -> None:
    from longctx.tokenizer import fingerprint, load_tokenizer, write_manifest

    manifest = fingerprint(tok, name="t")
    enc = manifest.encoding or load_tokenizer(tok).encoding_fingerprint()
    good = tmp_path / "good.toml"
    write_manifest(manifest.model_copy(update={"encoding": enc}), good)
    text = good.read_text()
    at = text.index("[encoding]")  # only the [encoding] table is edited; its digest stays
    bad = tmp_path / "bad.toml"
    bad.write_text(text[:at] + text[at:].replace(f"eod_id = {enc.eod_id}", f"eod_id = {enc.eod_id + 1}"))
    assert bad.read_text() != text
    refused(
        ["tokenizer", "check", tok, "--manifest", bad], [tmp_path], needle="not the digest of its own fields"
    )
