from __future__ import annotations

import gzip
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data import read_index, read_sidecar, tokenize_jsonl
from longctx.errors import DatasetError
from longctx.tokenizer import load_tokenizer

runner = CliRunner()


def _megatron_dataset(prefix: str):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix)


def test_documents_round_trip(oellm_like_dataset: str, data_jsonl: Path, oellm_like_hf_dir: Path) -> None:
    tok = load_tokenizer(oellm_like_hf_dir)
    texts = [json.loads(line)["text"] for line in data_jsonl.read_text(encoding="utf-8").splitlines()]
    ds = _megatron_dataset(oellm_like_dataset)
    assert len(ds) == len(texts)
    for i in (0, 17, len(texts) - 1):
        ids = ds[i].tolist()
        assert ids == [*tok.encode(texts[i]), tok.eod_id]
        assert tok.decode(ids[:-1]) == texts[i]
    info = read_index(oellm_like_dataset)
    assert info.dtype == np.dtype(np.uint16)  # vocab 513 < 65500
    sc = read_sidecar(oellm_like_dataset)
    assert sc is not None and sc.origin == "tokenize"
    assert (sc.tokenizer.md5, sc.tokenizer.vocab_size, sc.tokenizer.eod_id) == (tok.md5, tok.vocab_size, 2)
    assert (sc.documents, sc.tokens, sc.dtype) == (info.documents, info.tokens, "uint16")
    assert sc.inputs[0].documents == len(texts) and len(sc.inputs[0].sha256 or "") == 64


@pytest.mark.processes  # a worker pool: no rule sees a worker count
def test_workers_give_identical_output_and_gz_input(
    data_jsonl: Path, oellm_like_hf_dir: Path, oellm_like_dataset: str, tmp_path: Path
) -> None:
    gz = tmp_path / "docs.jsonl.gz"
    gz.write_bytes(gzip.compress(data_jsonl.read_bytes()))
    prefix = str(tmp_path / "w2")
    sc = tokenize_jsonl([gz], oellm_like_hf_dir, prefix, workers=2, progress=False)
    assert Path(prefix + ".bin").read_bytes() == Path(oellm_like_dataset + ".bin").read_bytes()
    assert Path(prefix + ".idx").read_bytes() == Path(oellm_like_dataset + ".idx").read_bytes()
    assert sc.inputs[0].bytes == gz.stat().st_size


def test_bos_blank_lines_and_empty_documents(oellm_like_spm: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "alpha"}\n\n{"body": ""}\n{"body": "beta gamma"}\n')
    prefix = str(tmp_path / "b")
    sc = tokenize_jsonl([src], oellm_like_spm, prefix, json_key="body", add_bos=True, progress=False)
    # the blank line is skipped; an empty text is an empty document, as Megatron writes it
    assert (sc.documents, sc.inputs[0].skipped_empty, sc.inputs[0].empty_documents) == (3, 1, 1)
    assert sc.add_bos and sc.megatron_flags is None  # --add-bos has no Megatron equivalent
    info = read_index(prefix)
    assert info.document_indices.tolist() == [0, 1, 1, 2]
    ds = _megatron_dataset(prefix)
    assert ds[0][0] == 1 and ds[0][-1] == 2 and ds[1][0] == 1 and ds[1][-1] == 2


def test_refuses_existing_prefix_unless_force(
    oellm_like_dataset: str, data_jsonl: Path, oellm_like_hf_dir: Path, tmp_path: Path
) -> None:
    prefix = str(tmp_path / "copy")
    for ext in (".bin", ".idx"):
        shutil.copy(oellm_like_dataset + ext, prefix + ext)
    res = runner.invoke(
        app, ["data", "tokenize", str(data_jsonl), "-t", str(oellm_like_hf_dir), "-o", prefix]
    )
    assert res.exit_code == 2
    assert "error: output prefix exists: copy.bin, copy.idx" in res.stderr
    res = runner.invoke(
        app, ["data", "tokenize", str(data_jsonl), "-t", str(oellm_like_hf_dir), "-o", prefix, "--force"]
    )
    assert res.exit_code == 0, res.output
    assert read_sidecar(prefix) is not None


@pytest.mark.processes  # a worker pool: no rule sees a worker count
def test_failure_leaves_nothing_behind(oellm_like_spm: Path, tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"text": broken\n')
    out = tmp_path / "out"
    for workers in (1, 2):
        with pytest.raises(DatasetError) as err:
            tokenize_jsonl([src], oellm_like_spm, out / "p", workers=workers, progress=False)
        assert err.value.what.startswith("line 3 is not valid JSON")
        assert err.value.where == f"{src}:3"
        assert not out.exists()  # the directory it created is gone too


def test_bad_inputs(oellm_like_spm: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"content": "x"}\n')
    with pytest.raises(DatasetError, match="line 1 has no 'text' field") as err:
        tokenize_jsonl([src], oellm_like_spm, tmp_path / "p", progress=False)
    assert "--json-key" in (err.value.fix or "") and "content" in (err.value.fix or "")
    with pytest.raises(DatasetError, match="input not found"):
        tokenize_jsonl([tmp_path / "nope.jsonl"], oellm_like_spm, tmp_path / "p", progress=False)
    zst = tmp_path / "in.jsonl.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(DatasetError, match=r"unsupported compression \.zst"):
        tokenize_jsonl([zst], oellm_like_spm, tmp_path / "p", progress=False)
