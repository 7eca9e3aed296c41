"""The streaming safetensors writer (read back with the safetensors library), and the export plan of the
real baby_9b_dense layout: every read is one layer's tensor or one saved chunk of the embedding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from longctx.arch import ModelArch
from longctx.bench.ckpt import BABY, build_baby_like
from longctx.errors import ExportError
from longctx.export import DcpReader, HfTensor, SafetensorsWriter, build_plan
from longctx.export.writer import layout


def test_pieces_shards_and_index_read_back(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(0)
    data = {
        "a": torch.randn(10, 4, generator=g),
        "b": torch.randn(3, generator=g),
        "c": torch.randn(6, 4, generator=g),
    }
    tensors = [HfTensor(k, tuple(v.shape)) for k, v in data.items()]
    w = SafetensorsWriter(
        tmp_path, tensors, torch.bfloat16, max_shard_bytes=50
    )  # a alone (larger than a shard), b, c
    w.write("a", data["a"][:7])  # a tensor in pieces of rows
    w.write("a", data["a"][7:])
    w.write("b", data["b"])
    with pytest.raises(ExportError, match="out of order"):
        w.write("b", data["b"])
    w.write("c", data["c"])
    files = w.close()
    assert files == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((tmp_path / files[-1]).read_text())
    assert index["metadata"]["total_size"] == (40 + 3 + 24) * 2
    for name, want in data.items():
        got = load_file(str(tmp_path / index["weight_map"][name]))[name]
        assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))


def test_incomplete_and_oversized_writes_are_refused(tmp_path: Path) -> None:
    w = SafetensorsWriter(tmp_path, [HfTensor("x", (2, 2))], torch.float32, max_shard_bytes=10**9)
    with pytest.raises(ExportError, match="more data than"):
        w.write("x", torch.zeros(3, 2))
    w.write("x", torch.zeros(1, 2))
    with pytest.raises(ExportError, match="ended before x"):
        w.close()
    w.abort()


def test_baby_9b_dense_export_plan_reads_one_layer_at_a_time(tmp_path: Path) -> None:
    """The real TP-4 torch_dist index of baby_9b_dense (sparse shards): the plan maps all of it, and its
    largest read is one saved chunk of the embedding, under 1.5 layers of weights."""
    build_baby_like(tmp_path, n_files=16, dp=4)
    arch = ModelArch(
        num_layers=36,
        hidden_size=4096,
        ffn_hidden_size=12288,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
    )
    vocab = 262145  # oellm-256k: len(tokenizer)
    plan = build_plan(DcpReader(tmp_path), arch, "qwen3", vocab, where=str(tmp_path))
    assert len(plan.tensors) == 1 + 36 * 11 + 2 and not plan.tied
    assert sum(t.numel for t in plan.tensors) == arch.param_count(vocab)
    h, f, q = 4096, 12288, (32 + 16) * 128
    layer_bytes = (q * h + h * 32 * 128 + 2 * f * h + h * f) * 2
    largest = plan.largest_read(2)
    assert largest == (BABY["padded_vocab_size"] // 4) * h * 2  # one TP rank's rows of the embedding
    assert largest < 1.5 * layer_bytes
    shards, _ = layout(plan.tensors, 2, 5 * 10**9)
    assert len(shards) == 4 and all(s.nbytes <= 5 * 10**9 for s in shards)
