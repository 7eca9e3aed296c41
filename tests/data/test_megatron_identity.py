"""`data tokenize` against the real Megatron-LM `tools/preprocess_data.py`: the same .bin/.idx, byte for byte.

Every case tokenizes one JSONL (leading spaces, runs of whitespace, several scripts, the literal text
of special tokens, an empty text, a whitespace-only text, a list of sentences) with longctx and with
the checkout's script (one child process runs all of them), for a Llama-class SentencePiece HF
directory, a Gemma-style one (OpenEuroLLM layout, tokenizer.json), the demo's own tokenizer, a bare
tokenizer.model and a GPT-2 BPE directory; with and without --append-eod, 1 and 2 workers, the
current and the legacy HF path (BOS), --tokenizer-hf-include-special-tokens and another JSON key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from longctx.bench.tokenize import megatron_outputs, preprocess_argv, run_preprocess_data
from longctx.data import read_index
from longctx.data.tokenize import tokenize_jsonl
from longctx.demo.run import DemoConfig, _tokenizer
from longctx.tokenizer import EncodingSpec, load_tokenizer
from tests.fixtures.processes import starts_processes

HF, SP, GPT2 = "HuggingFaceTokenizer", "GPTSentencePieceTokenizer", "GPT2BPETokenizer"


class Case(NamedTuple):
    tokenizer: str  # fixture name
    spec: EncodingSpec
    append_eod: bool
    workers: int
    json_key: str = "text"


def _cases() -> dict[str, Case]:
    out: dict[str, Case] = {}
    for name, fixture, kind, key in (
        ("llama", "llama_like_hf_dir", HF, "text"),
        ("gemma", "gemma_like_hf_dir", HF, "text"),
        ("spm", "oellm_like_spm", SP, "body"),
        ("gpt2", "gpt2_like_dir", GPT2, "text"),
    ):
        for eod in (True, False):
            for workers in (1, 2):
                out[f"{name}-{'eod' if eod else 'no-eod'}-w{workers}"] = Case(
                    fixture, EncodingSpec(kind), eod, workers, key
                )
    out["llama-legacy-bos-w2"] = Case("llama_like_hf_dir", EncodingSpec(HF, legacy=True), True, 2)
    out["gemma-include-special-w1"] = Case(
        "gemma_like_hf_dir", EncodingSpec(HF, hf_include_special_tokens=True), True, 1
    )
    out["demo-eod-w2"] = Case("demo_tokenizer_dir", EncodingSpec(HF), True, 2)
    return out


CASES = _cases()

TEXTS: list[str | list[str]] = [
    "the quick brown fox jumps over the lazy dog.",
    "  two leading spaces,  double  spaces and a trailing one ",
    "Grüße aus Köln: Straße, Käse und Übermut.\nÇa coûte 12,50 € à Noël.\n\n東京は日本の首都です。 🙂",
    "<s> literal </s> special <bos> token <eos> text <pad> here <|endoftext|> <start_of_turn>user",
    "",
    "   ",
    ["a first sentence.", "", "  a second sentence after an empty one"],
    "\tindented\n    code: return x * 2  # comment\n",
    " ".join(["long document with many words"] * 300),
]


@pytest.fixture(scope="module")
def demo_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("demo_tokenizer")
    _tokenizer(run_dir, DemoConfig.small(run_dir / "plan.toml"))  # the demo's own tokenizer step
    return run_dir / "tokenizer"


@pytest.fixture(scope="module")
@starts_processes  # longctx's tokenizer workers and Megatron-LM's preprocess_data.py
def identity_runs(
    megatron_lm: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, Path, Path, Path]]:
    root = tmp_path_factory.mktemp("megatron_identity")
    src = root / "docs.jsonl"
    with open(src, "w", encoding="utf-8") as fh:
        for i, text in enumerate(TEXTS):
            fh.write(json.dumps({"id": i, "text": text, "body": text}, ensure_ascii=False) + "\n")
    jobs: list[list[str]] = []
    out: dict[str, tuple[Path, Path, Path, Path]] = {}
    for name, case in CASES.items():
        tok = load_tokenizer(request.getfixturevalue(case.tokenizer), spec=case.spec)
        ours = root / "longctx" / name
        tokenize_jsonl(
            [src],
            tok,
            ours,
            json_key=case.json_key,
            workers=case.workers,
            append_eod=case.append_eod,
            progress=False,
        )
        theirs = root / "megatron" / name
        theirs.parent.mkdir(parents=True, exist_ok=True)
        jobs.append(
            preprocess_argv(
                tok, src, theirs, workers=case.workers, json_key=case.json_key, append_eod=case.append_eod
            )
        )
        out[name] = (Path(f"{ours}.bin"), Path(f"{ours}.idx"), *megatron_outputs(theirs, case.json_key))
    run_preprocess_data(megatron_lm, jobs)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_bytes_identical_to_preprocess_data(identity_runs: dict[str, tuple[Path, ...]], name: str) -> None:
    our_bin, our_idx, their_bin, their_idx = identity_runs[name]
    assert our_bin.read_bytes() == their_bin.read_bytes()
    assert our_idx.read_bytes() == their_idx.read_bytes()
    info = read_index(str(our_bin)[: -len(".bin")])
    assert info.documents == len(TEXTS) and info.tokens > 1000  # every line a document, the empty one too


def test_the_cases_differ_where_megatron_differs(identity_runs: dict[str, tuple[Path, ...]]) -> None:
    # the comparisons are not trivially equal: EOD, BOS and the HF config change the bytes
    data = {name: paths[0].read_bytes() for name, paths in identity_runs.items()}
    assert data["llama-eod-w1"] == data["llama-eod-w2"]
    assert data["llama-eod-w1"] != data["llama-no-eod-w1"]
    assert data["llama-eod-w2"] != data["llama-legacy-bos-w2"]
    assert data["gemma-eod-w1"] != data["demo-eod-w2"]  # same OpenEuroLLM layout, other model and config
