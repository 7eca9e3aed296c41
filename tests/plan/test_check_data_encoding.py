"""`plan check --check-data`: the stages' datasets must be encoded as the plan's tokenizer encodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data.tokenize import tokenize_jsonl
from longctx.demo.corpus import documents, write_jsonl
from longctx.tokenizer import fingerprint, write_manifest
from tests.fixtures.run import write_plan

runner = CliRunner()


def test_check_data_refuses_data_encoded_with_another_hf_config(
    oellm_like_hf_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    tok_dir = run_dir / "tokenizer"
    shutil.copytree(oellm_like_hf_dir, tok_dir)
    write_manifest(fingerprint(tok_dir, name="plan-tok"), tok_dir / "manifest.toml")
    corpus = run_dir / "corpus.jsonl"
    write_jsonl(corpus, documents(30, seed=3, min_words=200, max_words=600))
    # the data is made through a copy of the tokenizer whose HF config drops the leading-space prefix:
    # the same tokenizer.model, so the same md5
    other = tmp_path / "other-config"
    shutil.copytree(tok_dir, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["add_prefix_space"] = False
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    prefix = run_dir / "data" / "corpus_text_document"
    prefix.parent.mkdir(parents=True)
    tokenize_jsonl([corpus], other, prefix, progress=False)
    plan = write_plan(tmp_path / "plan.toml", run_dir)

    res = runner.invoke(app, ["plan", "check", str(plan), "--check-data"])
    assert res.exit_code == 2
    assert (
        "error: sidecar-encoding: dataset was encoded differently from how the given tokenizer encodes"
        in res.stderr
    )
    assert "sidecar-md5" not in res.stderr

    # re-tokenized with the plan's own tokenizer, the data passes
    tokenize_jsonl([corpus], tok_dir, prefix, force=True, progress=False)
    res = runner.invoke(app, ["plan", "check", str(plan), "--check-data"])
    assert "sidecar-encoding" not in res.output + res.stderr
    assert res.exit_code == 0, res.output + res.stderr
