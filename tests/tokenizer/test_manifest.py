from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.errors import TokenizerError
from longctx.tokenizer import TokenizerManifest, load_manifest, manifest_to_toml, padded_vocab_size


def test_repo_manifests(repo_root: Path) -> None:
    oellm = load_manifest(repo_root / "tokenization" / "oellm-256k.toml")
    assert oellm.md5 == "07295117baaf7a55d5924428e59925d6"
    assert (oellm.vocab_size, oellm.model_vocab_size, oellm.eod_id, oellm.pad_id) == (
        262145,
        262144,
        2,
        262144,
    )
    assert oellm.kind == "hf-sentencepiece" and oellm.megatron_tokenizer_type == "HuggingFaceTokenizer"
    assert oellm.special_tokens["<start_of_turn>"] == 3 and oellm.special_tokens["<end_of_turn>"] == 4
    assert oellm.added_tokens == {"<pad>": 262144}
    assert [padded_vocab_size(oellm.vocab_size, 128, tp) for tp in (1, 4, 8)] == [262272, 262656, 263168]
    assert any(not t.isascii() for t in oellm.round_trip)

    gpt2 = load_manifest(repo_root / "tokenization" / "gpt2.toml")
    assert (gpt2.vocab_size, gpt2.eod_id, gpt2.md5_of) == (50257, 50256, "vocab.json+merges.txt")
    assert gpt2.megatron_tokenizer_type == "GPT2BPETokenizer"


def test_malformed_md5(tmp_path: Path, repo_root: Path) -> None:
    text = (repo_root / "tokenization" / "oellm-256k.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("07295117baaf7a55d5924428e59925d6", "07295117baaf7a55d5924428e59925dz"))
    with pytest.raises(TokenizerError) as err:
        load_manifest(bad)
    assert err.value.what == (
        "invalid tokenizer manifest: md5: must be 32 hexadecimal digits, found '07295117baaf7a55d5924428e59925dz'"
    )
    assert err.value.where == str(bad)


def test_other_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer manifest not found"):
        load_manifest(tmp_path / "nope.toml")
    p = tmp_path / "x.toml"
    p.write_text("name = [")
    with pytest.raises(TokenizerError, match="not valid TOML"):
        load_manifest(p)
    p.write_text(
        'name = "x"\nkind = "sentencepiece"\nmegatron_tokenizer_type = "X"\nvocab_size = 10\neod_id = 2\n'
        '[special_tokens]\n"<x>" = 10\n'
    )
    with pytest.raises(TokenizerError, match=r"special_tokens: '<x>' has id 10, outside 0..9"):
        load_manifest(p)
    p.write_text(
        'name = "x"\nkind = "wordpiece"\nmegatron_tokenizer_type = "X"\nvocab_size = 10\neod_id = 2\n'
    )
    with pytest.raises(TokenizerError, match="invalid tokenizer manifest: kind"):
        load_manifest(p)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(deadline=None)
@given(st.lists(_text, max_size=4), st.dictionaries(_text, st.integers(0, 99), max_size=4), _text)
def test_toml_writer_round_trips(samples: list[str], specials: dict[str, int], desc: str) -> None:
    m = TokenizerManifest(
        name="t",
        description=desc,
        kind="sentencepiece",
        megatron_tokenizer_type="GPTSentencePieceTokenizer",
        md5="0" * 32,
        vocab_size=100,
        eod_id=2,
        round_trip=samples,
        special_tokens=specials,
    )
    assert TokenizerManifest.model_validate(tomllib.loads(manifest_to_toml(m, header="a\n\nb"))) == m


HOSTILE = [
    'quote " and \\ backslash',
    "new\nline\r\n",
    "tab\tbell\x07 nul\x00 del\x7f esc\x1b",
    "'''\"\"\"",
    "[t]\nk = 1",
]


def test_control_characters_quotes_and_newlines_round_trip() -> None:
    m = TokenizerManifest(
        name="n\x01",
        description=HOSTILE[0],
        source=HOSTILE[1],
        kind="sentencepiece",
        megatron_tokenizer_type="GPTSentencePieceTokenizer",
        vocab_size=100,
        eod_id=2,
        round_trip=HOSTILE,
        special_tokens={text: idx for idx, text in enumerate(HOSTILE)},
        added_tokens={"\x00\n": 99},
    )
    text = manifest_to_toml(m, header="line one\n\nline three")
    assert text.startswith("# line one\n#\n# line three\n\n")
    assert TokenizerManifest.model_validate(tomllib.loads(text)) == m
