"""verify passes on the right tokenizer and fails, with the right message and exit code, on each bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import TokenizerError, TokenizerMismatch
from longctx.tokenizer import (
    DEFAULT_ROUND_TRIP,
    fingerprint,
    load_manifest,
    load_tokenizer,
    verify_tokenizer,
    write_manifest,
)
from longctx.tokenizer.spm_proto import PieceType, parse_model
from tests.fixtures.tokenizer import OELLM_LIKE_VOCAB

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


# -- the right tokenizer -----------------------------------------------------------------------------
def test_verify_passes_on_the_right_tokenizer(oellm_like_hf_dir: Path, oellm_like_manifest: Path) -> None:
    report = verify_tokenizer(oellm_like_hf_dir, load_manifest(oellm_like_manifest), tp=4)
    assert report.ok, report.findings
    assert report.facts["vocab_size"] == OELLM_LIKE_VOCAB + 1
    assert report.facts["padded_vocab_size"] == 1024  # 513 rounded up to a multiple of 128 × 4
    report.raise_for_errors()

    res = cli("tokenizer", "check", oellm_like_hf_dir, "--manifest", oellm_like_manifest, "--tp", 4)
    assert res.exit_code == 0, res.output
    assert "verify against oellm-like: OK" in res.output


def test_fingerprint_write_then_verify_each_kind(
    oellm_like_spm: Path, oellm_like_hf_dir: Path, gpt2_like_dir: Path, tmp_path: Path
) -> None:
    for i, path in enumerate((oellm_like_spm, oellm_like_hf_dir, gpt2_like_dir)):
        out = tmp_path / f"m{i}.toml"
        res = cli("tokenizer", "fingerprint", path, "--write", out)
        assert res.exit_code == 0, res.output
        assert 'md5 = "' in res.output
        res = cli("tokenizer", "check", path, "-m", out, "--json")
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert data["ok"] is True and data["facts"]["md5"] == load_tokenizer(path).md5


def test_verify_by_md5_only(oellm_like_spm: Path) -> None:
    md5 = load_tokenizer(oellm_like_spm).md5
    res = cli("tokenizer", "check", oellm_like_spm, "--md5", md5.upper())
    assert res.exit_code == 0, res.output


def test_padded_vocab_cli() -> None:
    res = cli("tokenizer", "padded-vocab", 262145, "--tp", 1, "--tp", 4, "--tp", 8, "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["padded"] == {"1": 262272, "4": 262656, "8": 263168}


def test_tiny_tokenizer_is_not_the_openeurollm_one(oellm_like_hf_dir: Path, repo_root: Path) -> None:
    res = cli("tokenizer", "check", oellm_like_hf_dir, "-m", repo_root / "tokenization" / "oellm-256k.toml")
    assert res.exit_code == 2
    assert (
        "error: md5: md5 of tokenizer.model differs (expected 07295117baaf7a55d5924428e59925d6" in res.stderr
    )
    assert (
        "error: vocab-size: vocab size (len(tokenizer), Megatron's view) differs "
        f"(expected 262145, found {OELLM_LIKE_VOCAB + 1})" in res.stderr
    )


# -- bad inputs: one test each -----------------------------------------------------------------------
def test_missing_file(tmp_path: Path, oellm_like_manifest: Path) -> None:
    missing = tmp_path / "tokenizer.model"
    with pytest.raises(TokenizerError, match="tokenizer not found"):
        load_tokenizer(missing)
    res = cli("tokenizer", "check", missing, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert f"error: tokenizer not found: {missing}" in res.stderr


def test_empty_file(tmp_path: Path, oellm_like_manifest: Path) -> None:
    empty = tmp_path / "tokenizer.model"
    empty.write_bytes(b"")
    res = cli("tokenizer", "check", empty, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert "error: tokenizer file is empty: tokenizer.model" in res.stderr


def test_not_a_sentencepiece_model(tmp_path: Path, oellm_like_manifest: Path) -> None:
    bogus = tmp_path / "tokenizer.model"
    bogus.write_text('{"this": "is json, not a protobuf"}')
    res = cli("tokenizer", "check", bogus, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert (
        "error: not a SentencePiece model: tokenizer.model cannot be parsed as a SentencePiece ModelProto"
        in res.stderr
    )


def _flip_one_score_byte(model: bytes) -> bytes:
    """Change the lowest byte of a normal piece's score: still a valid model, different md5."""
    piece = next(p for p in parse_model(model).pieces if p.type == PieceType.NORMAL and p.score != 0.0)
    raw = piece.piece.encode()
    entry = bytes([0x0A, len(raw)]) + raw + b"\x15"  # field 1 (piece), then field 2 (score, fixed32)
    pos = model.index(entry) + len(entry)
    data = bytearray(model)
    data[pos] ^= 0x01
    return bytes(data)


def test_md5_mismatch_one_byte_changed(
    oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    d = tmp_path / "tok"
    shutil.copytree(oellm_like_hf_dir, d)
    model = d / "tokenizer.model"
    model.write_bytes(_flip_one_score_byte(model.read_bytes()))
    tok = load_tokenizer(d)  # still loads: only the identity differs
    expected = load_manifest(oellm_like_manifest).md5
    report = verify_tokenizer(tok, load_manifest(oellm_like_manifest))
    assert report.findings.codes("error") == ["md5"]
    with pytest.raises(TokenizerMismatch, match=r"md5 of tokenizer\.model differs"):
        report.raise_for_errors()
    res = cli("tokenizer", "check", d, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert f"error: md5: md5 of tokenizer.model differs (expected {expected}, found {tok.md5})" in res.stderr


def test_wrong_vocab_size(tokenizer_corpus: list[str], oellm_like_manifest: Path, tmp_path: Path) -> None:
    from longctx.tokenizer import train_sentencepiece

    train_sentencepiece(tokenizer_corpus, tmp_path, OELLM_LIKE_VOCAB + 64, hf=True)
    res = cli("tokenizer", "check", tmp_path, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    n = OELLM_LIKE_VOCAB
    assert (
        f"error: vocab-size: vocab size (len(tokenizer), Megatron's view) differs (expected {n + 1}, found {n + 65})"
        in res.stderr
    )
    assert (
        f"error: model-vocab-size: number of tokens in tokenizer.model differs (expected {n}, found {n + 64})"
        in res.stderr
    )
    assert (
        f"error: added-token: added token '<pad>' is at id {n + 64} (expected {n}, found {n + 64})"
        in res.stderr
    )


def test_special_token_at_another_id(
    tokenizer_corpus: list[str], oellm_like_manifest: Path, tmp_path: Path
) -> None:
    from longctx.tokenizer import train_sentencepiece

    model = train_sentencepiece(
        tokenizer_corpus,
        tmp_path,
        OELLM_LIKE_VOCAB,
        hf=True,
        user_defined=("<end_of_turn>", "<start_of_turn>"),
    )
    report = verify_tokenizer(model.parent, load_manifest(oellm_like_manifest))
    # the swapped ids also change how text with those tokens encodes
    assert set(report.findings.codes("error")) == {"md5", "special-token", "encoding"}
    res = cli("tokenizer", "check", model.parent, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert (
        "error: special-token: special token '<start_of_turn>' is at id 4 (expected 3, found 4)" in res.stderr
    )
    assert (
        "error: special-token: special token '<end_of_turn>' is at id 3 (expected 4, found 3)" in res.stderr
    )


def test_hf_dir_without_tokenizer_model(
    oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    d = tmp_path / "json-only"
    shutil.copytree(oellm_like_hf_dir, d)
    (d / "tokenizer.model").unlink()
    res = cli("tokenizer", "check", d, "-m", oellm_like_manifest)
    assert res.exit_code == 2
    assert (
        "error: HF tokenizer directory has no tokenizer.model (found tokenizer.json, tokenizer_config.json, "
        "special_tokens_map.json)" in res.stderr
    )
    res = cli("tokenizer", "fingerprint", d)
    assert res.exit_code == 2


def test_manifest_with_malformed_md5(
    oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    text = oellm_like_manifest.read_text()
    md5 = load_manifest(oellm_like_manifest).md5
    bad.write_text(text.replace(md5, md5[:-3]))
    res = cli("tokenizer", "check", oellm_like_hf_dir, "-m", bad, "--json")
    assert res.exit_code == 2
    assert (
        f"error: invalid tokenizer manifest: md5: must be 32 hexadecimal digits, found '{md5[:-3]}'"
        in res.stderr
    )
    assert json.loads(res.stdout)["error"]["type"] == "TokenizerError"
    res = cli("tokenizer", "check", oellm_like_hf_dir, "--md5", "xyz")
    assert res.exit_code == 2
    assert "error: --md5 must be 32 hexadecimal digits, found 'xyz'" in res.stderr


# -- other mismatches ---------------------------------------------------------------------------------
def test_bare_model_against_hf_manifest(oellm_like_spm: Path, oellm_like_manifest: Path) -> None:
    report = verify_tokenizer(oellm_like_spm, load_manifest(oellm_like_manifest))
    # the manifest declares HuggingFaceTokenizer, which cannot encode with a bare model file
    assert set(report.findings.codes("error")) == {"kind", "vocab-size", "added-token", "pad", "encoding"}
    kind = next(f for f in report.findings if f.code == "kind")
    assert "pass the HF tokenizer directory" in kind.message


def test_round_trip_failure_is_reported(tokenizer_corpus: list[str], tmp_path: Path) -> None:
    from longctx.tokenizer import train_sentencepiece

    model = train_sentencepiece(tokenizer_corpus, tmp_path, OELLM_LIKE_VOCAB, byte_fallback=False)
    m = fingerprint(model)  # pins only samples that survive on this tokenizer
    assert "Grüße aus Köln: Straße, Käse und Übermut." in m.round_trip
    assert len(m.round_trip) < len(DEFAULT_ROUND_TRIP)  # unseen characters come back as <unk>
    m = m.model_copy(update={"round_trip": [*m.round_trip, "alef ℵ here"]})
    write_manifest(m, tmp_path / "m.toml")
    res = cli("tokenizer", "check", model, "-m", tmp_path / "m.toml")
    assert res.exit_code == 2
    n = len(m.round_trip) - 1
    assert (
        f"error: round-trip: sample {n} does not survive encode → decode (first difference at character 5: "
        "'ℵ here' became ' ⁇  here') (expected alef ℵ here, found alef  ⁇  here)" in res.stderr
    )


def test_json_vs_model_disagreement_is_flagged(
    oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    d = tmp_path / "tok"
    shutil.copytree(oellm_like_hf_dir, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["model"]["merges"] = tj["model"]["merges"][: len(tj["model"]["merges"]) // 4]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    # against a manifest, which pins both the md5 (tokenizer.model) and the encoding (tokenizer.json): error
    report = verify_tokenizer(d, load_manifest(oellm_like_manifest))
    assert "json-vs-model" in report.findings.codes("error")
    # without one nothing says which file is meant: a warning
    assert "json-vs-model" in verify_tokenizer(d).findings.codes("warning")


def test_encoding_pinned_under_other_options_is_refused(
    oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    """[encoding]'s digest covers behaviour only: its Megatron options are compared on their own."""
    manifest = load_manifest(oellm_like_manifest)
    assert manifest.encoding is not None
    assert "encoding-options" not in verify_tokenizer(oellm_like_hf_dir, manifest).findings.codes("error")
    other = manifest.model_copy(
        update={"encoding": manifest.encoding.model_copy(update={"tokenizer_type": "GPT2BPETokenizer"})}
    )
    found = verify_tokenizer(oellm_like_hf_dir, other).findings
    assert "encoding-options" in found.codes("error")
    flipped = manifest.model_copy(
        update={
            "encoding": manifest.encoding.model_copy(
                update={"legacy_tokenizer": not manifest.encoding.legacy_tokenizer}
            )
        }
    )
    # checked under the flipped option it encodes differently: the behaviour check refuses it
    assert "encoding" in verify_tokenizer(oellm_like_hf_dir, flipped).findings.codes("error")
