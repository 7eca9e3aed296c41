"""The demo's data, the demo's evaluation and a fresh `data tokenize` encode text the same way."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data import read_index, read_sidecar
from longctx.data.tokenize import tokenize_jsonl
from longctx.demo.run import Corpus, DemoConfig, _corpus, _data, _tokenizer
from longctx.eval.grid import segment_tokens
from longctx.eval.passkey_text import passkey_statement
from longctx.eval.runner import _plan_tokenizer
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from tests.fixtures.run import write_plan


@pytest.mark.processes  # the demo's data step tokenizes with a pool of 2 workers
def test_demo_data_eval_and_fresh_tokenize_agree(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    plan = write_plan(tmp_path / "plan.toml", run_dir)
    cfg = dataclasses.replace(DemoConfig.small(plan), corpora=(Corpus("corpus", 12, 60, 600, 1),))
    for step in (_tokenizer, _corpus, _data):  # the demo's own steps
        step(run_dir, cfg)
    prefix = run_dir / "data" / "corpus_text_document"
    train = run_dir / "corpus" / "corpus.jsonl"

    # a fresh `longctx data tokenize` (one worker; the demo used two) writes the same bytes
    fresh = tmp_path / "fresh"
    res = CliRunner().invoke(
        app, ["data", "tokenize", str(train), "-t", str(run_dir / "tokenizer"), "-o", str(fresh), "-w", "1"]
    )
    assert res.exit_code == 0, res.output + res.stderr
    for ext in (".bin", ".idx"):
        assert Path(f"{fresh}{ext}").read_bytes() == Path(f"{prefix}{ext}").read_bytes()

    # the evaluation's tokenizer (the plan's, as the demo's evaluation loads it) encodes as the data did
    tok = _plan_tokenizer(resolve_plan(load_plan(plan)))
    sc = read_sidecar(prefix)
    assert sc is not None and sc.tokenizer.encoding is not None
    assert tok.spec.tokenizer_type == "HuggingFaceTokenizer"
    assert tok.encoding_fingerprint().digest == sc.tokenizer.encoding.digest
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    texts = [json.loads(line)["text"] for line in train.read_text(encoding="utf-8").splitlines()]
    for i in (0, len(texts) - 1):
        assert ds[i].tolist() == [*tok.encode(texts[i]), tok.eod_id]

    # a passkey statement as the grid tokenizes it is what the data holds for it mid-text
    statement = passkey_statement("Mira", "40213")
    src = tmp_path / "statement.jsonl"
    src.write_text(json.dumps({"text": f". {statement}"}) + "\n")
    tokenize_jsonl([src], run_dir / "tokenizer", tmp_path / "statement", progress=False)
    held = np.fromfile(
        tmp_path / "statement.bin", dtype=read_index(str(tmp_path / "statement")).dtype
    ).tolist()
    seg = segment_tokens(tok, statement)
    assert held[-1 - len(seg) : -1] == seg
