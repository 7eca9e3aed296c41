"""`data check` compares the sidecar's encoding fingerprint with the tokenizer's, not only the md5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data import check_datasets, fingerprint_dataset, read_sidecar
from longctx.data.sidecar import sidecar_path
from longctx.data.tokenize import tokenize_jsonl
from longctx.tokenizer import load_tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, oellm_like_hf_dir: Path) -> tuple[Path, Path, str]:
    """(tokenizer dir, the same model with another HF config, a dataset made with the first)."""
    root = tmp_path_factory.mktemp("encoding_check")
    other = root / "no-prefix"
    shutil.copytree(oellm_like_hf_dir, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["add_prefix_space"] = False
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    src = root / "docs.jsonl"
    src.write_text(
        "".join(json.dumps({"text": f"the document number {i}, Grüße."}) + "\n" for i in range(20))
    )
    prefix = str(root / "docs_text_document")
    tokenize_jsonl([src], oellm_like_hf_dir, prefix, progress=False)
    return oellm_like_hf_dir, other, prefix


def test_sidecar_records_encoding_and_files(made: tuple[Path, Path, str]) -> None:
    tok_dir, _, prefix = made
    sc = read_sidecar(prefix)
    assert sc is not None and sc.tokenizer.encoding is not None
    enc = sc.tokenizer.encoding
    assert (enc.tokenizer_type, enc.library) == ("HuggingFaceTokenizer", "transformers")
    assert enc.digest == load_tokenizer(tok_dir).encoding_fingerprint().digest
    assert set(sc.tokenizer.files or {}) >= {"tokenizer.model", "tokenizer.json", "tokenizer_config.json"}
    assert sc.megatron_flags is not None and sc.megatron_flags[:2] == [
        "--tokenizer-type",
        "HuggingFaceTokenizer",
    ]
    assert "--append-eod" in sc.megatron_flags
    report = check_datasets([prefix], tokenizer=tok_dir, progress=False)
    assert report.ok


def test_same_md5_other_hf_config_is_refused(made: tuple[Path, Path, str]) -> None:
    tok_dir, other, prefix = made
    assert load_tokenizer(other).md5 == load_tokenizer(tok_dir).md5
    report = check_datasets([prefix], tokenizer=other, progress=False)
    errors = report.all_findings().errors
    assert [f.code for f in errors] == ["sidecar-encoding"]
    f = errors[0]
    assert f.message.startswith(
        "dataset was encoded differently from how the given tokenizer encodes: the probe"
    )
    assert f.where == str(sidecar_path(prefix))
    assert "re-tokenize the data with the model's tokenizer directory and type" in (f.fix or "")
    res = runner.invoke(app, ["data", "check", prefix, "-t", str(other)])
    assert res.exit_code == 2 and "error: sidecar-encoding: dataset was encoded differently" in res.stderr
    # another declared Megatron type on the very directory the data was made with
    res = runner.invoke(
        app, ["data", "check", prefix, "-t", str(tok_dir), "--tokenizer-type", "GPTSentencePieceTokenizer"]
    )
    assert res.exit_code == 2 and "error: sidecar-encoding:" in res.stderr


def test_sidecar_without_encoding_warns_and_fingerprint_records_one(
    made: tuple[Path, Path, str], tmp_path: Path
) -> None:
    tok_dir, _, prefix = made
    copy = str(tmp_path / "old")
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, copy + ext)
    data = json.loads(sidecar_path(prefix).read_text())
    data["tokenizer"].pop("encoding")
    sidecar_path(copy).write_text(json.dumps(data))
    report = check_datasets([copy], tokenizer=tok_dir, progress=False)
    assert report.ok and "sidecar-encoding" in report.all_findings().codes("warning")
    sc = fingerprint_dataset(copy, tok_dir, force=True, progress=False)
    assert sc.tokenizer.encoding is not None
    assert check_datasets([copy], tokenizer=tok_dir, progress=False, strict=True).ok
