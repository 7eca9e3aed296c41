"""The exported tokenizer files load in transformers and encode like the tokenizer Megatron used, for the
three layouts: an HF SentencePiece directory (copied as it is), a bare `tokenizer.model` (tokenizer.json
and a config written for it) and GPT-2 BPE files (a config written for them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longctx.errors import ExportError
from longctx.export.tokenizer import check_identity, export_tokenizer, first_difference, samples
from longctx.tokenizer import fingerprint, load_tokenizer, tokenizer_md5, train_sentencepiece
from longctx.tokenizer.verify import DEFAULT_ROUND_TRIP


def _export(src: Path, out: Path) -> tuple[object, object]:
    tok = load_tokenizer(src)
    manifest = fingerprint(src, name="t")
    check_identity(tok, manifest, saved_md5=tok.md5, where="ckpt")
    out.mkdir()
    return tok, export_tokenizer(tok, manifest, out, max_length=4096)


def test_demo_layout_hf_directory_is_copied_and_encodes_alike(
    tokenizer_corpus: list[str], tmp_path: Path
) -> None:
    # the demo's tokenizer: tokenizer.model + HF side files (LlamaTokenizer), no tokenizer.json
    src = tmp_path / "demo_tok"
    train_sentencepiece(tokenizer_corpus, src, 512, hf=True)
    tok, res = _export(src, tmp_path / "out")
    assert set(res.copied) == {
        "tokenizer.model",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
    }
    assert res.written == [] and res.tokenizer_class == "LlamaTokenizer"
    for name in res.copied:
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()
    assert first_difference(tmp_path / "out", tok, list(DEFAULT_ROUND_TRIP)) is None


def test_bare_sentencepiece_model_gets_a_tokenizer_json(oellm_like_spm: Path, tmp_path: Path) -> None:
    tok, res = _export(oellm_like_spm, tmp_path / "out")
    out = tmp_path / "out"
    assert res.copied == ["tokenizer.model"] and set(res.written) == {
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert tokenizer_md5(out) == tok.md5
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["eos_token"] == "<eos>"
    assert cfg["model_max_length"] == 4096
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    assert hf.eos_token_id == tok.eod_id and len(hf) == tok.vocab_size
    text = "Grüße aus Köln: 12,50 € 🙂"
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf.decode(tok.encode(text)) == text


def test_gpt2_files_get_a_gpt2_config(gpt2_like_dir: Path, tmp_path: Path) -> None:
    _, res = _export(gpt2_like_dir, tmp_path / "out")
    assert set(res.copied) == {"vocab.json", "merges.txt"} and res.written == ["tokenizer_config.json"]
    assert res.tokenizer_class == "GPT2Tokenizer" and res.samples_checked >= len(DEFAULT_ROUND_TRIP)


def test_refused_before_copying(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(oellm_like_hf_dir)
    manifest = fingerprint(oellm_like_hf_dir, name="t")
    with pytest.raises(ExportError, match="md5"):
        check_identity(tok, manifest.model_copy(update={"md5": "1" * 32}), saved_md5=None, where="ckpt")
    with pytest.raises(ExportError, match="tokens, the manifest says"):
        check_identity(tok, manifest.model_copy(update={"vocab_size": 9999}), saved_md5=None, where="ckpt")
    with pytest.raises(ExportError, match="another tokenizer"):
        check_identity(tok, manifest, saved_md5="2" * 32, where="ckpt")
    assert len(samples(manifest)) > len(DEFAULT_ROUND_TRIP)
