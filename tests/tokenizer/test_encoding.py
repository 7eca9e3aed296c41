"""Encoding identity: the fingerprint of how Megatron's tokenizer type turns text into ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data.tokenize import tokenize_jsonl
from longctx.errors import DatasetError, TokenizerError
from longctx.tokenizer import (
    EncodingSpec,
    fingerprint,
    load_manifest,
    load_tokenizer,
    train_sentencepiece,
    verify_tokenizer,
    write_manifest,
)

runner = CliRunner()


def _with_config(src: Path, dst: Path, **changes: object) -> Path:
    """A copy of an HF directory (same tokenizer.model) with tokenizer_config.json changed."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.update(changes)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory, tokenizer_corpus: list[str]) -> Path:
    """The demo's layout: OpenEuroLLM specials, LlamaTokenizer config, no tokenizer.json."""
    out = tmp_path_factory.mktemp("demo_like")
    train_sentencepiece(tokenizer_corpus, out, 512, hf=True)
    return out


def test_hf_directory_encodes_as_transformers_not_as_the_model_file(demo_like: Path) -> None:
    hf = load_tokenizer(demo_like)
    raw = load_tokenizer(demo_like, "GPTSentencePieceTokenizer")
    assert hf.md5 == raw.md5  # the same tokenizer.model
    # transformers' LlamaTokenizer puts "▁" before the first word, the model file itself does not
    assert hf.id_to_token(hf.encode("the cat")[0]).startswith("▁")  # type: ignore[union-attr]
    assert not raw.id_to_token(raw.encode("the cat")[0]).startswith("▁")  # type: ignore[union-attr]
    a, b = hf.encoding_fingerprint(), raw.encoding_fingerprint()
    assert (a.library, a.tokenizer_class, b.library) == ("transformers", "LlamaTokenizer", "sentencepiece")
    assert a.digest != b.digest
    assert a.vocab_size == 513 and b.vocab_size == 512  # len(tokenizer) vs the model's pieces


def test_same_model_other_hf_config_is_told_apart(demo_like: Path, tmp_path: Path) -> None:
    base = load_tokenizer(demo_like).encoding_fingerprint()
    for name, change in {
        "no-prefix": {"add_prefix_space": False},
        "no-bos": {"add_bos_token": False},
        "legacy": {"legacy": True},
    }.items():
        other = load_tokenizer(_with_config(demo_like, tmp_path / name, **change))
        assert other.md5 == load_tokenizer(demo_like).md5
        assert other.encoding_fingerprint().digest != base.digest, name
    # BOS added by the legacy HF path (tokenizer(text).input_ids), not by the current one
    legacy = load_tokenizer(demo_like, EncodingSpec("HuggingFaceTokenizer", legacy=True))
    assert legacy.encode("x")[0] == 1 and load_tokenizer(demo_like).encode("x")[0] != 1


def test_manifest_pins_the_encoding_and_verify_refuses_another(demo_like: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    write_manifest(fingerprint(demo_like, name="demo-like"), manifest)
    m = load_manifest(manifest)
    assert (
        m.encoding is not None
        and m.encoding.digest == load_tokenizer(demo_like).encoding_fingerprint().digest
    )
    assert "[encoding]" in manifest.read_text()
    assert verify_tokenizer(demo_like, m).ok

    other = _with_config(demo_like, tmp_path / "no-prefix", add_prefix_space=False)
    res = runner.invoke(app, ["tokenizer", "check", str(other), "-m", str(manifest)])
    assert res.exit_code == 2
    assert (
        "error: encoding: the tokenizer encodes differently from the manifest's fingerprint: the probe "
        in res.stderr
    )
    assert "first difference at probe text 0, token 0" in res.stderr
    # the md5 alone passes: that is the gap the fingerprint closes
    report = verify_tokenizer(other, m)
    assert "md5" not in report.findings.codes("error") and report.findings.codes("error") == ["encoding"]
    finding = report.findings.errors[0]
    assert finding.where == str(other) and "use the tokenizer directory the model was trained with" in (
        finding.fix or ""
    )
    # another declared type on the same directory is another encoding too
    res = runner.invoke(
        app,
        [
            "tokenizer",
            "check",
            str(demo_like),
            "-m",
            str(manifest),
            "--tokenizer-type",
            "GPTSentencePieceTokenizer",
        ],
    )
    assert res.exit_code == 2 and "error: encoding:" in res.stderr


def test_hf_config_that_disagrees_with_the_model_is_refused(
    tokenizer_corpus: list[str], tmp_path: Path
) -> None:
    # a GemmaTokenizer config on a model without <mask>: transformers adds one, len(tokenizer) grows
    d = tmp_path / "gemma-config"
    train_sentencepiece(tokenizer_corpus, d, 512, hf=True, hf_class="GemmaTokenizer")
    report = verify_tokenizer(d, md5=load_tokenizer(d).md5)
    assert report.findings.codes("error") == ["consistency"]
    assert (
        "transformers loads 514 tokens (len(tokenizer), what Megatron sizes the embedding by), but "
        "tokenizer.model and the HF files declare 513" in report.findings.errors[0].message
    )
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    res = runner.invoke(app, ["data", "tokenize", str(src), "-t", str(d), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert (
        "error: the tokenizer's files disagree, no data written: transformers loads 514 tokens" in res.stderr
    )
    assert not list(tmp_path.glob("out*"))
    with pytest.raises(TokenizerError, match="inconsistent"):
        fingerprint(d)


def test_double_bos_and_impossible_types_are_refused(
    demo_like: Path, oellm_like_spm: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    legacy = EncodingSpec("HuggingFaceTokenizer", legacy=True)
    with pytest.raises(DatasetError, match="already starts every document with BOS"):
        tokenize_jsonl([src], demo_like, tmp_path / "p", spec=legacy, add_bos=True, progress=False)
    with pytest.raises(TokenizerError, match="HuggingFaceTokenizer needs an HF tokenizer directory"):
        tokenize_jsonl([src], oellm_like_spm, tmp_path / "p", spec="HuggingFaceTokenizer", progress=False)
    res = runner.invoke(
        app,
        [
            "data",
            "tokenize",
            str(src),
            "-t",
            str(demo_like),
            "-o",
            str(tmp_path / "p"),
            "--tokenizer-type",
            "TikTokenizer",
        ],
    )
    assert res.exit_code == 2 and "tokenizer type 'TikTokenizer' is not supported" in res.stderr


def test_gpt2_encoding_reads_merges_as_megatron_does(gpt2_like_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(gpt2_like_dir)
    fp = tok.encoding_fingerprint()
    assert (fp.library, fp.eod_id, fp.vocab_size) == ("tokenizers", 399, 400)
    # Megatron's GPT-2 tokenizer drops the first line of merges.txt whatever it holds: without the
    # "#version" header the first merge is lost, and the ids change
    d = tmp_path / "no-header"
    shutil.copytree(gpt2_like_dir, d)
    lines = (d / "merges.txt").read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("#version")
    (d / "merges.txt").write_text("\n".join(lines[1:]), encoding="utf-8")
    assert load_tokenizer(d).encoding_fingerprint().digest != fp.digest
