"""The same HF tokenizer directory and the same `--tokenizer-type HuggingFaceTokenizer` give other ids on
Megatron-LM 0.16 and 0.19 (0.17 made the fast tokenizer and the special tokens the default): the encoding
a plan declares follows its release, and data made under one release's defaults is refused for another."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data import check_datasets
from longctx.data.tokenize import tokenize_jsonl
from longctx.errors import TokenizerError
from longctx.tokenizer import fingerprint, load_manifest, load_tokenizer, write_manifest
from longctx.tokenizer.encoding import (
    HF_TYPE,
    EncodingFingerprint,
    EncodingSpec,
    declared_spec,
    encoding_differences,
    release_spec,
    version_flags,
    version_spec,
)
from tests.fixtures.run import write_plan

runner = CliRunner()


def test_defaults_per_release() -> None:
    assert version_spec(HF_TYPE, "0.16.1") == EncodingSpec(HF_TYPE)
    new = EncodingSpec(HF_TYPE, hf_use_fast=True, hf_include_special_tokens=True)
    assert version_spec(HF_TYPE, "0.17.0") == version_spec(HF_TYPE, "0.19.0") == new
    assert declared_spec(HF_TYPE, None, "0.19") == new and declared_spec(HF_TYPE, None) == EncodingSpec(
        HF_TYPE
    )
    assert version_spec("GPTSentencePieceTokenizer", "0.19") == EncodingSpec("GPTSentencePieceTokenizer")


def test_flags_that_keep_an_encoding_across_releases() -> None:
    old, new = version_spec(HF_TYPE, "0.16.1"), version_spec(HF_TYPE, "0.19.0")
    assert version_flags(old, "0.16.1") == ["--tokenizer-type", HF_TYPE]
    assert version_flags(old, "0.19.0")[2:] == [
        "--tokenizer-hf-no-use-fast",
        "--tokenizer-hf-no-include-special-tokens",
    ]
    assert version_flags(new, "0.16.1")[2:] == [
        "--tokenizer-hf-use-fast",
        "--tokenizer-hf-include-special-tokens",
    ]
    assert version_flags(new, "0.19.0") == ["--tokenizer-type", HF_TYPE]
    # 0.17 and 0.18 have no switch back to the 0.16 defaults: refused, not emitted
    with pytest.raises(TokenizerError, match=r"use_fast = False cannot be asked of Megatron-LM 0\.18\.0"):
        version_flags(old, "0.18.0")
    with pytest.raises(TokenizerError, match=r"--legacy-tokenizer does not exist in Megatron-LM 0\.19"):
        version_flags(EncodingSpec(HF_TYPE, legacy=True), "0.19")


def test_same_directory_other_ids_and_data_refused(
    oellm_like_hf_dir: Path, data_jsonl: Path, tmp_path: Path
) -> None:
    """A real HF directory (SentencePiece model + LlamaTokenizer config): 0.19's defaults put its BOS in
    front of every document, so data tokenized under 0.16's defaults is refused for a 0.19 plan."""
    t16 = load_tokenizer(oellm_like_hf_dir, spec=version_spec(HF_TYPE, "0.16.1"))
    t19 = load_tokenizer(oellm_like_hf_dir, spec=version_spec(HF_TYPE, "0.19.0"))
    assert t16.md5 == t19.md5
    a, b = t16.encode("the quick brown fox"), t19.encode("the quick brown fox")
    assert a != b and b[1:] == a and b[0] == t19.encoding_fingerprint().bos_id
    diff = encoding_differences(t16.encoding_fingerprint(), t19.encoding_fingerprint())
    assert diff and "probe texts encode differently" in diff[0]

    prefix = str(tmp_path / "made_on_016_text_document")
    tokenize_jsonl(
        [data_jsonl], oellm_like_hf_dir, prefix, spec=version_spec(HF_TYPE, "0.16.1"), progress=False
    )
    assert check_datasets(prefix, tokenizer=t16, scan=False).ok
    report = check_datasets(prefix, tokenizer=t19, scan=False)
    assert not report.ok
    assert {f.code for f in report.all_findings() if f.level == "error"} == {"sidecar-encoding"}
    # `data check` with 0.19's encoding spelled out refuses the same data, exit 2
    res = runner.invoke(
        app,
        [
            "data",
            "check",
            prefix,
            "-t",
            str(oellm_like_hf_dir),
            "--no-scan",
            "--tokenizer-type",
            HF_TYPE,
            "--tokenizer-hf-use-fast",
            "--tokenizer-hf-include-special-tokens",
        ],
    )
    assert res.exit_code == 2 and "error: sidecar-encoding:" in res.stderr, res.stderr


def test_tokenizer_check_refuses_the_other_releases_defaults(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    """A manifest fingerprinted under 0.19's defaults; the directory checked as 0.16 encodes it: exit 2.
    The pinned options then make a 0.16 plan emit 0.16's switches for them."""
    manifest = tmp_path / "m19.toml"
    write_manifest(fingerprint(oellm_like_hf_dir, name="m19", spec=version_spec(HF_TYPE, "0.19")), manifest)
    ok = runner.invoke(
        app,
        [
            "tokenizer",
            "check",
            str(oellm_like_hf_dir),
            "-m",
            str(manifest),
            "--tokenizer-type",
            HF_TYPE,
            "--tokenizer-hf-use-fast",
            "--tokenizer-hf-include-special-tokens",
        ],
    )
    assert ok.exit_code == 0, ok.stderr
    res = runner.invoke(
        app, ["tokenizer", "check", str(oellm_like_hf_dir), "-m", str(manifest), "--tokenizer-type", HF_TYPE]
    )
    assert res.exit_code == 2 and "error: encoding:" in res.stderr
    pinned = declared_spec(None, load_manifest(manifest), "0.16.1")
    assert pinned is not None and version_flags(pinned, "0.16.1")[2:] == [
        "--tokenizer-hf-use-fast",
        "--tokenizer-hf-include-special-tokens",
    ]
    with pytest.raises(TokenizerError, match=r"cannot be asked of Megatron-LM 0\.18"):
        declared_spec(
            None,
            load_manifest(manifest).model_copy(update={"encoding": t16_fingerprint(oellm_like_hf_dir)}),
            "0.18",
        )


def t16_fingerprint(directory: Path) -> EncodingFingerprint:
    return load_tokenizer(directory, spec=version_spec(HF_TYPE, "0.16.1")).encoding_fingerprint()


def _tokenize(data: Path, tok: Path, prefix: Path, *options: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(
        app, ["data", "tokenize", str(data), "-t", str(tok), "-o", str(prefix), "--json", *options]
    )
    return res.exit_code, json.loads(res.stdout)


def _first_document(prefix: Path) -> list[int]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))  # held while reading: its arrays view the dataset's memory map
    return [int(t) for t in ds[0]]


def test_release_spec_turns_switches_on_over_the_defaults() -> None:
    assert release_spec(HF_TYPE, "0.16.1") == version_spec(HF_TYPE, "0.16.1")
    assert release_spec(HF_TYPE, "0.16.1", hf_use_fast=True, hf_include_special_tokens=True) == version_spec(
        HF_TYPE, "0.19"
    )
    assert release_spec(HF_TYPE, "0.19", hf_use_fast=True) == version_spec(HF_TYPE, "0.19")
    with pytest.raises(TokenizerError, match=r"--legacy-tokenizer does not exist in Megatron-LM 0\.19"):
        release_spec(HF_TYPE, "0.19", legacy=True)


def test_data_tokenize_follows_the_megatron_version(
    oellm_like_hf_dir: Path, data_jsonl: Path, tmp_path: Path
) -> None:
    """The same text and HF directory under 0.16's and 0.19's defaults: other ids (0.19 puts BOS first),
    other encoding fingerprints, the release and its preprocess_data.py flags in the sidecar; 0.16 with
    both switches on is 0.19's encoding spelled in 0.16's flags."""
    made = {}
    for version in ("0.16.1", "0.19"):
        prefix = tmp_path / f"on_{version}_text_document"
        code, made[version] = _tokenize(data_jsonl, oellm_like_hf_dir, prefix, "--megatron-version", version)
        assert code == 0, made[version]
    s16, s19 = made["0.16.1"], made["0.19"]
    assert (s16["megatron_version"], s19["megatron_version"]) == ("0.16.1", "0.19.0")
    e16, e19 = s16["tokenizer"]["encoding"], s19["tokenizer"]["encoding"]
    assert (e16["hf_use_fast"], e16["hf_include_special_tokens"]) == (False, False)
    assert (e19["hf_use_fast"], e19["hf_include_special_tokens"]) == (True, True)
    assert e16["digest"] != e19["digest"]
    assert s16["megatron_flags"][:2] == s19["megatron_flags"][:2] == ["--tokenizer-type", HF_TYPE]
    assert not [w for w in s16["megatron_flags"] + s19["megatron_flags"] if w.startswith("--tokenizer-hf")]
    a, b = (
        _first_document(tmp_path / "on_0.16.1_text_document"),
        _first_document(tmp_path / "on_0.19_text_document"),
    )
    assert a != b and b == [e19["bos_id"], *a]

    code, both_on = _tokenize(
        data_jsonl,
        oellm_like_hf_dir,
        tmp_path / "switched_text_document",
        "--megatron-version",
        "0.16.1",
        "--tokenizer-type",
        HF_TYPE,
        "--tokenizer-hf-use-fast",
        "--tokenizer-hf-include-special-tokens",
    )
    assert code == 0 and both_on["tokenizer"]["encoding"]["digest"] == e19["digest"]
    assert both_on["megatron_flags"][2:4] == [
        "--tokenizer-hf-use-fast",
        "--tokenizer-hf-include-special-tokens",
    ]


@pytest.mark.parametrize(
    ("options", "said", "where"),
    [
        (
            ["--megatron-version", "latest"],
            "cannot read a Megatron-LM version from 'latest'",
            "--megatron-version",
        ),
        (
            ["--megatron-version", "99.0.0"],
            "Megatron-LM 99.0.0 is newer than any release longctx knows",
            "--megatron-version",
        ),
        (["--megatron-version", "9" * 5000], "cannot read a Megatron-LM version", "--megatron-version"),
        (
            ["--megatron-version", "0.19", "--tokenizer-type", HF_TYPE, "--legacy-tokenizer"],
            "--legacy-tokenizer does not exist in Megatron-LM 0.19.0",
            "Megatron-LM 0.19.0",
        ),
    ],
)
def test_data_tokenize_refuses_what_the_release_cannot_say(
    oellm_like_hf_dir: Path, data_jsonl: Path, tmp_path: Path, options: list[str], said: str, where: str
) -> None:
    code, doc = _tokenize(data_jsonl, oellm_like_hf_dir, tmp_path / "x_text_document", *options)
    assert code == 2 and doc["ok"] is False
    assert said in doc["error"]["what"] and doc["error"]["where"] == where and doc["error"]["fix"]
    assert list(tmp_path.iterdir()) == []


def test_plan_check_refuses_data_made_for_the_other_release(
    oellm_like_hf_dir: Path, data_jsonl: Path, tmp_path: Path
) -> None:
    """A plan on Megatron-LM 0.19 whose manifest pins no encoding encodes with 0.19's defaults: data made with
    `data tokenize --megatron-version 0.16.1` is refused by `plan check --check-data`, 0.19's passes."""
    run_dir = tmp_path / "run"
    tok_dir = run_dir / "tokenizer"
    shutil.copytree(oellm_like_hf_dir, tok_dir)
    unpinned = fingerprint(tok_dir, name="plan-tok").model_copy(update={"encoding": None})
    write_manifest(unpinned, tok_dir / "manifest.toml")
    plan = write_plan(tmp_path / "plan.toml", run_dir, extra='\n[megatron]\nversion = "0.19.0"\n')
    prefix = run_dir / "data" / "corpus_text_document"
    assert _tokenize(data_jsonl, tok_dir, prefix, "--megatron-version", "0.16.1")[0] == 0
    res = runner.invoke(app, ["plan", "check", str(plan), "--check-data"])
    assert res.exit_code == 2
    assert (
        "error: sidecar-encoding: dataset was encoded differently from how the given tokenizer encodes"
        in (res.stderr)
    )
    assert _tokenize(data_jsonl, tok_dir, prefix, "--megatron-version", "0.19.0", "--force")[0] == 0
    res = runner.invoke(app, ["plan", "check", str(plan), "--check-data"])
    assert "sidecar-encoding" not in res.output + res.stderr
    assert res.exit_code == 0, res.output + res.stderr
