from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

from longctx.tokenizer import load_tokenizer, tokenizer_md5
from tests.fixtures.tokenizer import GPT2_LIKE_VOCAB, OELLM_LIKE_VOCAB

TEXT = "Grüße aus Köln — Καλημέρα, Привет, 東京 🙂 <start_of_turn>hi<end_of_turn>"


def test_oellm_like_spm_layout(oellm_like_spm: Path) -> None:
    tok = load_tokenizer(oellm_like_spm)
    assert tok.kind == "sentencepiece"
    assert tok.megatron_tokenizer_type == "GPTSentencePieceTokenizer"
    assert tok.vocab_size == tok.model_vocab_size == OELLM_LIKE_VOCAB
    assert tok.special_tokens == {
        "<unk>": 0,
        "<bos>": 1,
        "<eos>": 2,
        "<start_of_turn>": 3,
        "<end_of_turn>": 4,
    }
    assert (tok.unk_id, tok.bos_id, tok.eod_id, tok.pad_id) == (0, 1, 2, None)
    assert tok.md5 == hashlib.md5(oellm_like_spm.read_bytes()).hexdigest() == tokenizer_md5(oellm_like_spm)
    assert tok.md5_of == "tokenizer.model"
    ids = tok.encode(TEXT)
    assert 3 in ids and 4 in ids  # user-defined tokens are single pieces in text
    assert tok.decode(ids) == TEXT
    assert tok.encode("x", add_bos=True)[0] == 1
    assert tok.problems == []


def test_hf_dir_counts_added_pad(oellm_like_hf_dir: Path, oellm_like_spm: Path) -> None:
    tok = load_tokenizer(oellm_like_hf_dir)
    assert tok.kind == "hf-sentencepiece"
    assert tok.megatron_tokenizer_type == "HuggingFaceTokenizer"
    assert tok.model_vocab_size == OELLM_LIKE_VOCAB
    assert tok.vocab_size == OELLM_LIKE_VOCAB + 1  # len(tokenizer): <pad> added beyond the model
    assert tok.added_tokens == {"<pad>": OELLM_LIKE_VOCAB}
    assert (tok.bos_id, tok.eod_id, tok.pad_id) == (1, 2, OELLM_LIKE_VOCAB)
    assert tok.encoder == "tokenizer.json"
    assert tok.md5 == load_tokenizer(oellm_like_spm).md5  # identity is tokenizer.model
    assert tok.problems == []
    # tokenizer.json and tokenizer.model agree on ordinary text
    assert tok.encode_with_tokenizer_json(TEXT) == tok.encode_with_model_file(TEXT)
    # encode is Megatron's HuggingFaceTokenizer (transformers): added tokens are split out of the text
    assert OELLM_LIKE_VOCAB in tok.encode("a <pad> b")
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_added_tokens_from_each_side_file(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    # each of the three places that can declare an added token is enough on its own
    cases = {
        "added_tokens.json": ["tokenizer.json", "tokenizer_config.json"],
        "tokenizer_config.json": ["tokenizer.json", "added_tokens.json"],
        "tokenizer.json": ["added_tokens.json", "tokenizer_config.json"],
    }
    for keep, drop in cases.items():
        d = tmp_path / keep
        shutil.copytree(oellm_like_hf_dir, d)
        for name in drop:
            (d / name).unlink()
        tok = load_tokenizer(d)
        assert tok.vocab_size == OELLM_LIKE_VOCAB + 1, keep
        assert tok.added_tokens == {"<pad>": OELLM_LIKE_VOCAB}, keep
        if keep == "tokenizer_config.json":
            assert tok.problems == []
        else:
            assert any("no tokenizer_config.json" in p for p in tok.problems)


def test_sentencepiece_decode_splices_added_tokens(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "nojson"
    shutil.copytree(oellm_like_hf_dir, d)
    (d / "tokenizer.json").unlink()
    tok = load_tokenizer(d, "GPTSentencePieceTokenizer")
    assert tok.encoder == "sentencepiece"
    assert tok.decode([*tok.encode("ab"), OELLM_LIKE_VOCAB, *tok.encode("cd")]) == "ab<pad>cd"


def test_conflicting_and_gapped_added_tokens(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "conflict"
    shutil.copytree(oellm_like_hf_dir, d)
    (d / "added_tokens.json").write_text(json.dumps({"<pad>": OELLM_LIKE_VOCAB + 5}))
    tok = load_tokenizer(d)
    assert any("'<pad>' is id" in p and "added_tokens.json" in p for p in tok.problems)

    d2 = tmp_path / "gap"
    shutil.copytree(oellm_like_hf_dir, d2)
    (d2 / "tokenizer.json").unlink()
    cfg = json.loads((d2 / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"].pop(str(OELLM_LIKE_VOCAB))
    (d2 / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d2 / "added_tokens.json").write_text(json.dumps({"<pad>": OELLM_LIKE_VOCAB + 3}))
    tok2 = load_tokenizer(d2)
    assert tok2.vocab_size == OELLM_LIKE_VOCAB + 1
    assert any("leave a gap" in p for p in tok2.problems)


def test_added_token_declared_over_a_model_piece(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "overlap"
    shutil.copytree(oellm_like_hf_dir, d)
    (d / "tokenizer.json").unlink()
    (d / "added_tokens.json").write_text(json.dumps({"<pad>": 3}))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"].pop(str(OELLM_LIKE_VOCAB))
    cfg["pad_token"] = None
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<eos>"}))
    tok = load_tokenizer(d)
    assert (
        "added token '<pad>' is declared at id 3, but id 3 is '<start_of_turn>' in tokenizer.model"
        in tok.problems
    )


def test_gpt2_like(gpt2_like_dir: Path) -> None:
    tok = load_tokenizer(gpt2_like_dir)
    assert tok.kind == "gpt2-bpe"
    assert tok.megatron_tokenizer_type == "GPT2BPETokenizer"
    assert tok.vocab_size == GPT2_LIKE_VOCAB
    assert tok.eod_id == GPT2_LIKE_VOCAB - 1 == tok.token_to_id("<|endoftext|>")
    vocab = json.loads((gpt2_like_dir / "vocab.json").read_text())
    assert list(vocab)[-1] == "<|endoftext|>"
    combined = (gpt2_like_dir / "vocab.json").read_bytes() + (gpt2_like_dir / "merges.txt").read_bytes()
    assert tok.md5 == hashlib.md5(combined).hexdigest() == tokenizer_md5(gpt2_like_dir)
    assert tok.md5_of == "vocab.json+merges.txt"
    assert tok.decode(tok.encode(TEXT)) == TEXT
    # a path to vocab.json means its directory
    assert load_tokenizer(gpt2_like_dir / "vocab.json").md5 == tok.md5


def test_pickles_by_path(oellm_like_hf_dir: Path) -> None:
    tok = load_tokenizer(oellm_like_hf_dir)
    again = pickle.loads(pickle.dumps(tok))
    assert again.encode(TEXT) == tok.encode(TEXT)
    assert again.vocab_size == tok.vocab_size


def test_training_is_deterministic(tokenizer_corpus: list[str], oellm_like_spm: Path, tmp_path: Path) -> None:
    from longctx.tokenizer import train_sentencepiece

    again = train_sentencepiece(tokenizer_corpus, tmp_path, OELLM_LIKE_VOCAB)
    assert again.read_bytes() == oellm_like_spm.read_bytes()
