"""A tokenizer directory longctx writes with tokenizer.json encodes exactly as the same directory
without it: transformers 5 takes BOS/EOS from tokenizer.json's post-processor when the file exists and
from tokenizer_config.json when it converts tokenizer.model, so the file must add what the config says.
A difference would be the "same md5, different ids" mistake between a user's copy and longctx's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import transformers

from longctx.tokenizer import fingerprint, synthetic_corpus, train_sentencepiece

TEXTS = ["hello world", "", " two  spaces\tand a tab\nnew line", "Grüße aus Köln 12345 🙂", "<eos> inside"]


@pytest.mark.parametrize(("bos", "eos"), [(True, False), (True, True), (False, False)])
def test_tokenizer_json_adds_what_the_config_says(tmp_path: Path, bos: bool, eos: bool) -> None:
    with_json = tmp_path / "with-json"
    train_sentencepiece(
        synthetic_corpus(600, seed=3),
        with_json,
        512,
        hf=True,
        tokenizer_json=True,
        add_bos_token=bos,
        add_eos_token=eos,
    )
    converted = tmp_path / "converted"
    shutil.copytree(with_json, converted)
    (converted / "tokenizer.json").unlink()

    fast = transformers.AutoTokenizer.from_pretrained(with_json)
    conv = transformers.AutoTokenizer.from_pretrained(converted)
    for text in TEXTS:
        ids = fast(text).input_ids
        assert ids == conv(text).input_ids, text
        assert (ids[:1] == [1]) is bos and (ids[-1:] == [2]) is eos
    # longctx's encoding fingerprint (the ids Megatron's HuggingFaceTokenizer gives) agrees as well
    assert fingerprint(with_json).encoding == fingerprint(converted).encoding
