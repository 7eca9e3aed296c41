"""The same HF tokenizer directory and the same `--tokenizer-type HuggingFaceTokenizer` give other ids on
Megatron-LM 0.16 and 0.19 (0.17 made the fast tokenizer and the special tokens the default): the encoding
a plan declares follows its release, and data made under one release's defaults is refused for another."""

from __future__ import annotations

from pathlib import Path

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
    version_flags,
    version_spec,
)

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
    res = runner.invoke(app, ["data", "check", prefix, "-t", str(oellm_like_hf_dir), "--no-scan",
                              "--tokenizer-type", HF_TYPE, "--tokenizer-hf-use-fast",
                              "--tokenizer-hf-include-special-tokens"])  # fmt: skip
    assert res.exit_code == 2 and "error: sidecar-encoding:" in res.stderr, res.stderr


def test_tokenizer_check_refuses_the_other_releases_defaults(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    """A manifest fingerprinted under 0.19's defaults; the directory checked as 0.16 encodes it: exit 2.
    The pinned options then make a 0.16 plan emit 0.16's switches for them."""
    manifest = tmp_path / "m19.toml"
    write_manifest(fingerprint(oellm_like_hf_dir, name="m19", spec=version_spec(HF_TYPE, "0.19")), manifest)
    ok = runner.invoke(app, ["tokenizer", "check", str(oellm_like_hf_dir), "-m", str(manifest),
                             "--tokenizer-type", HF_TYPE, "--tokenizer-hf-use-fast",
                             "--tokenizer-hf-include-special-tokens"])  # fmt: skip
    assert ok.exit_code == 0, ok.stderr
    res = runner.invoke(app, ["tokenizer", "check", str(oellm_like_hf_dir), "-m", str(manifest),
                              "--tokenizer-type", HF_TYPE])  # fmt: skip
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
