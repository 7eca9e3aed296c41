"""Checkpoint inspect + verify at the scale of OpenEuroLLM's baby_9b_dense snapshot, without 119 GiB.

The fixture is a flat snapshot directory whose `.metadata` is a real torch DCP `Metadata` describing the
baby_9b_dense tensors (36 layers, hidden 4096, FFN 12288 SwiGLU, 32 heads, 8 query groups, kv 128,
QK-norm, untied, padded vocab 262656 at TP 4; bf16) plus Megatron's dp_reshardable distributed-optimizer
state (fp32 param/exp_avg/exp_avg_sq per bucket, one set per TP rank, each split over DP 256), stored
over 2049 `.distcp` files created *sparse* with `truncate` to the sizes the index requires; `common.pt`
holds the saved args (iteration 76800), beside `metadata.json` and `modelopt_run_config.yaml`.

Measured in one process, after imports (medians of repeats, each starting with no cached index):
building the fixture; the baseline — plain `pickle.load` of `.metadata`, which is what torch's
`FileSystemReader.read_metadata` does; `inspect_checkpoint` (cold); `verify_checkpoint` right after it
(the index is shared within a process); and `verify_checkpoint` alone (cold). An audit hook counts
every file opened during the timed calls: the claim "no shard contents read" is that no `.distcp` file
is opened at all (sizes come from stat); shard atimes before/after are reported as a second witness
where the filesystem keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint import CheckpointReport, VerifyReport, inspect_checkpoint, verify_checkpoint
from longctx.checkpoint.metadata import clear_index_cache
from longctx.checkpoint.unpickle import gc_paused

BABY = dict(
    num_layers=36,
    hidden_size=4096,
    ffn_hidden_size=12288,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
    padded_vocab_size=262656,
    tp=4,
    dp=256,
    iteration=76800,
)
BUCKET_NUMEL = 256_000_000  # Megatron's default bucket size with overlap-grad-reduce: max(40M, 1M·DP)


@dataclass
class CkptBenchReport:
    files: int
    tensors: int
    storage_items: int
    metadata_bytes: int
    logical_bytes: int
    disk_bytes: int
    build_s: float
    baseline_unpickle_s: float
    inspect_s: float
    verify_s: float  # right after inspect in the same process (the DCP index is read once)
    verify_cold_s: float  # alone, reading .metadata itself
    repeats: int
    shard_opens: int
    other_opens: list[str]
    atime_changed: int | None
    inferred: dict[str, Any] = field(default_factory=dict)
    verify_ok: bool = True
    path: str = ""

    @property
    def total_s(self) -> float:
        return self.inspect_s + self.verify_s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_s"] = self.total_s
        d["ratio_to_baseline"] = self.total_s / self.baseline_unpickle_s if self.baseline_unpickle_s else None
        return d


def _baby_tensors(
    dp: int = BABY["dp"],
) -> list[tuple[str, tuple[int, ...], Any, list[tuple[tuple[int, ...], tuple[int, ...]]]]]:
    """(key, global shape, dtype, chunks[(offsets, sizes)]) as megatron-core saves them at TP 4."""
    import torch  # torch dtypes: see _IndexBuilder.add_tensors

    b = BABY
    L, H, F, tp = b["num_layers"], b["hidden_size"], b["ffn_hidden_size"], b["tp"]
    nq, ng, d, V = b["num_attention_heads"], b["num_query_groups"], b["kv_channels"], b["padded_vocab_size"]
    qkv = (nq + 2 * ng) * d
    bf16, f32 = torch.bfloat16, torch.float32
    out = []

    def per_layer(
        key: str, shape: tuple[int, ...], dtype: Any, split_dim: int | None, halves: int = 1
    ) -> None:
        chunks = []
        for layer in range(L):
            if split_dim is None:
                chunks.append(((layer, *[0] * (len(shape) - 1)), (1, *shape[1:])))
                continue
            part = shape[split_dim] // (tp * halves)
            for h in range(halves):
                for r in range(tp):
                    off = [layer] + [0] * (len(shape) - 1)
                    off[split_dim] = (h * tp + r) * part
                    size = [1, *shape[1:]]
                    size[split_dim] = part
                    chunks.append((tuple(off), tuple(size)))
        out.append((key, shape, dtype, chunks))

    out.append(
        (
            "embedding.word_embeddings.weight",
            (V, H),
            bf16,
            [((r * V // tp, 0), (V // tp, H)) for r in range(tp)],
        )
    )
    per_layer("decoder.layers.self_attention.linear_qkv.layer_norm_weight", (L, H), bf16, None)
    per_layer("decoder.layers.self_attention.linear_qkv.weight", (L, qkv, H), bf16, 1)
    per_layer("decoder.layers.self_attention.q_layernorm.weight", (L, d), bf16, None)
    per_layer("decoder.layers.self_attention.k_layernorm.weight", (L, d), bf16, None)
    per_layer("decoder.layers.self_attention.linear_proj.weight", (L, H, nq * d), bf16, 2)
    per_layer("decoder.layers.mlp.linear_fc1.layer_norm_weight", (L, H), bf16, None)
    per_layer("decoder.layers.mlp.linear_fc1.weight", (L, 2 * F, H), bf16, 1, halves=2)
    per_layer("decoder.layers.mlp.linear_fc2.weight", (L, H, F), bf16, 2)
    out.append(("decoder.final_layernorm.weight", (H,), bf16, [((0,), (H,))]))
    out.append(("output_layer.weight", (V, H), bf16, [((r * V // tp, 0), (V // tp, H)) for r in range(tp)]))
    # distributed optimizer, dp_reshardable: per TP rank one gradient buffer cut into buckets
    model_numel = sum(_numel(s) for _, s, _, _ in out)
    per_tp = model_numel // tp
    for r in range(tp):
        start, bi = 0, 0
        while start < per_tp:
            n = min(BUCKET_NUMEL, per_tp - start)
            key = f"optimizer.distributed.dp_group_idx_{r}.gbuf_idx_0.dtype_{(bf16, f32)}.bucket_idx_{bi}"
            per_dp = -(-n // dp)
            chunks = [((k * per_dp,), (min(per_dp, n - k * per_dp),)) for k in range(dp) if k * per_dp < n]
            for name in ("param", "exp_avg", "exp_avg_sq"):
                out.append((f"{key}.{name}", (n,), f32, chunks))
            start += n
            bi += 1
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def build_baby_like(
    directory: str | os.PathLike[str], n_files: int = 2049, dp: int = BABY["dp"]
) -> dict[str, int]:
    """Write the sparse baby_9b_dense-like snapshot into `directory` (see module docstring); a smaller
    `dp` splits the optimizer buckets over fewer ranks (fewer stored items, same bytes)."""
    with gc_paused():  # ~100k small objects: collections would dominate
        return _build_baby_like(Path(directory), n_files, dp)


class _IndexBuilder:
    """The DCP index being written: each stored item goes to the next `.distcp` file in turn (or a
    given one) at that file's end."""

    def __init__(self, n_files: int) -> None:
        self.names = [f"__{i}_0.distcp" for i in range(n_files)]
        self.ends = [0] * n_files
        self.sdm: dict[str, Any] = {}
        self.storage: dict[Any, Any] = {}
        self.slot = 0
        self.logical = 0

    def _place(self, length: int, file: int | None = None) -> tuple[str, int, int]:
        """(file name, offset, length) of the next item; the round robin advances only without `file`."""
        if file is None:
            file = self.slot % len(self.names)
            self.slot += 1
        where = (self.names[file], self.ends[file], length)
        self.ends[file] += length
        return where

    def add_tensors(self, dp: int) -> None:
        import torch  # the fixture is a real torch DCP index; torch is loaded only to build it
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata,
            MetadataIndex,
            TensorProperties,
            TensorStorageMetadata,
        )

        for key, shape, dtype, chunks in _baby_tensors(dp):
            itemsize = torch.empty((), dtype=dtype).element_size()
            self.sdm[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype),
                size=torch.Size(shape),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in chunks],
            )
            for o, s in chunks:
                length = _numel(s) * itemsize
                self.storage[MetadataIndex(fqn=key, offset=torch.Size(o))] = _StorageInfo(
                    *self._place(length)
                )
                self.logical += length

    def add_bytes(self, key: str, length: int, file: int | None = None) -> None:
        from torch.distributed.checkpoint.filesystem import _StorageInfo  # torch: see add_tensors
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

        self.sdm[key] = BytesStorageMetadata()
        self.storage[MetadataIndex(fqn=key)] = _StorageInfo(*self._place(length, file))

    def add_bytes_objects(self) -> None:
        """TE extra state per layer and module; per TP rank the optimizer's objects and the RNG state."""
        L = BABY["num_layers"]
        for module in (
            "self_attention.linear_qkv",
            "self_attention.linear_proj",
            "mlp.linear_fc1",
            "mlp.linear_fc2",
        ):
            for layer in range(L):
                self.add_bytes(f"decoder.layers.{module}._extra_state/shard_{layer}_{L}", 1261)
        for r in range(BABY["tp"]):
            for obj in ("optimizer", "per_bucket_numel", "per_bucket_numel_unpadded"):
                self.add_bytes(f"optimizer.distributed.dp_group_idx_{r}.{obj}/shard_0_1", 2048, file=r)
            self.add_bytes(f"rng_state/shard_0.{r}_1.{BABY['tp']}", 8192, file=r)

    def write(self, out: Path) -> None:
        """`.metadata`, and every shard file at its size without writing a block."""
        from torch.distributed.checkpoint.metadata import Metadata  # torch: see add_tensors

        md = Metadata(state_dict_metadata=self.sdm, storage_data=self.storage)
        with open(out / ".metadata", "wb") as fh:
            pickle.dump(md, fh)
        for name, end in zip(self.names, self.ends, strict=True):
            with open(out / name, "wb") as fh:
                fh.truncate(end)  # sparse: no blocks written


def _build_baby_like(out: Path, n_files: int, dp: int) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    index = _IndexBuilder(n_files)
    index.add_tensors(dp)
    index.add_bytes_objects()
    index.write(out)
    _write_common_state(out)
    (out / "metadata.json").write_text(
        json.dumps(
            {
                "sharded_backend": "torch_dist",
                "sharded_backend_version": 1,
                "common_backend": "torch",
                "common_backend_version": 1,
            }
        )
    )
    (out / "modelopt_run_config.yaml").write_text(
        "# written by the benchmark fixture\nmodelopt_state: null\n"
    )
    return {
        "files": n_files,
        "tensors": len(index.sdm),
        "storage_items": len(index.storage),
        "logical_bytes": index.logical,
    }


def _write_common_state(out: Path) -> None:
    """`common.pt` as Megatron saves it: the args, iteration and scheduler of the baby_9b_dense run."""
    import torch  # torch.save and torch.bfloat16: see _IndexBuilder.add_tensors

    args = argparse.Namespace(
        num_layers=BABY["num_layers"],
        hidden_size=BABY["hidden_size"],
        ffn_hidden_size=BABY["ffn_hidden_size"],
        num_attention_heads=BABY["num_attention_heads"],
        group_query_attention=True,
        num_query_groups=BABY["num_query_groups"],
        kv_channels=BABY["kv_channels"],
        swiglu=True,
        qk_layernorm=True,
        normalization="RMSNorm",
        norm_epsilon=1e-5,
        untie_embeddings_and_output_weights=True,
        add_bias_linear=False,
        position_embedding_type="rope",
        rotary_base=100000,
        rotary_percent=1.0,
        seq_length=4096,
        max_position_embeddings=4096,
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model="/leonardo_scratch/fast/OELLM_prod2026/production_training/baby_9b_dense/tokenizer",
        padded_vocab_size=BABY["padded_vocab_size"],
        make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=BABY["tp"],
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        use_distributed_optimizer=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        iteration=BABY["iteration"],
    )
    torch.save(
        {
            "args": args,
            "checkpoint_version": 3.0,
            "iteration": BABY["iteration"],
            "content_metadata": {"distrib_optim_sharding_type": "dp_reshardable"},
            "opt_param_scheduler": {"max_lr": 3.5e-4, "num_steps": BABY["iteration"] * 2048},
        },
        out / "common.pt",
    )


class _OpenCounter:
    """Counts files opened (audit event "open") while active; audit hooks cannot be removed, so one
    hook per process is installed and switched on and off."""

    _installed: _OpenCounter | None = None

    def __init__(self) -> None:
        self.active = False
        self.opened: list[str] = []

    @classmethod
    def get(cls) -> _OpenCounter:
        if cls._installed is None:
            counter = cls()

            def hook(event: str, args: tuple[Any, ...]) -> None:
                if (
                    counter.active
                    and event == "open"
                    and args
                    and isinstance(args[0], (str, bytes, os.PathLike))
                ):
                    counter.opened.append(os.fsdecode(args[0]))

            sys.addaudithook(hook)
            cls._installed = counter
        return cls._installed


def _atimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_atime_ns for p in directory.glob("*.distcp")}


@dataclass
class _Timings:
    """Seconds per repeat of each timed call, and the results of the last repeat."""

    baseline: list[float] = field(default_factory=list)
    inspect: list[float] = field(default_factory=list)
    verify: list[float] = field(default_factory=list)
    verify_cold: list[float] = field(default_factory=list)
    report: CheckpointReport | None = None
    verification: VerifyReport | None = None


def _time_calls(root: Path, repeats: int, counter: _OpenCounter) -> _Timings:
    """Time the baseline unpickle, then inspect + verify with the open counter on, `repeats` times."""
    t = _Timings()
    for _ in range(repeats):
        start = time.perf_counter()
        with open(root / ".metadata", "rb") as fh:
            pickle.load(fh)
        t.baseline.append(time.perf_counter() - start)
        counter.opened.clear()
        counter.active = True
        try:
            clear_index_cache()  # each repeat starts cold: nothing read before
            start = time.perf_counter()
            t.report = inspect_checkpoint(root)
            t.inspect.append(time.perf_counter() - start)
            start = time.perf_counter()
            t.verification = verify_checkpoint(root)  # reuses the index inspect just read
            t.verify.append(time.perf_counter() - start)
            clear_index_cache()
            start = time.perf_counter()
            verify_checkpoint(root)  # as `longctx ckpt check` alone: reads .metadata itself
            t.verify_cold.append(time.perf_counter() - start)
        finally:
            counter.active = False
    return t


def _inferred(report: CheckpointReport, verification: VerifyReport) -> dict[str, Any]:
    """What inspect and verify found, for the reader to compare with BABY."""
    a = report.arch
    return {
        "num_layers": a.num_layers,
        "hidden_size": a.hidden_size,
        "ffn_hidden_size": a.ffn_hidden_size,
        "num_attention_heads": a.num_attention_heads,
        "num_query_groups": a.num_query_groups,
        "kv_channels": a.kv_channels,
        "padded_vocab_size": a.padded_vocab_size,
        "qk_layernorm": a.qk_layernorm,
        "untie_embeddings_and_output_weights": a.untie_embeddings_and_output_weights,
        "iteration": report.iteration,
        "contents": report.contents,
        "optimizer_layout": report.optimizer.layout if report.optimizer else None,
        "dp_groups": report.optimizer.dp_groups if report.optimizer else None,
        "shard_files_verified": verification.shard_files,
    }


def run_ckpt_bench(
    n_files: int = 2049, repeats: int = 3, keep: str | os.PathLike[str] | None = None, dp: int = BABY["dp"]
) -> CkptBenchReport:
    """Build the fixture, then time baseline unpickle, inspect and verify (medians of `repeats`)."""
    os.environ.setdefault("LONGCTX_NO_PROGRESS", "1")
    tmp = None
    if keep is None:
        tmp = tempfile.TemporaryDirectory(prefix="longctx-ckpt-bench-")
        root = Path(tmp.name) / "baby_9b_dense_snapshot"
    else:
        root = Path(keep)
    try:
        t0 = time.perf_counter()
        info = build_baby_like(root, n_files, dp)
        build_s = time.perf_counter() - t0
        disk = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        before = _atimes(root)
        counter = _OpenCounter.get()
        t = _time_calls(root, repeats, counter)
        after = _atimes(root)
        assert t.report is not None and t.verification is not None
        return CkptBenchReport(
            files=info["files"],
            tensors=info["tensors"],
            storage_items=info["storage_items"],
            metadata_bytes=(root / ".metadata").stat().st_size,
            logical_bytes=t.report.files_bytes,
            disk_bytes=disk,
            build_s=build_s,
            baseline_unpickle_s=statistics.median(t.baseline),
            inspect_s=statistics.median(t.inspect),
            verify_s=statistics.median(t.verify),
            verify_cold_s=statistics.median(t.verify_cold),
            repeats=repeats,
            shard_opens=sum(1 for p in counter.opened if p.endswith(".distcp")),
            other_opens=sorted(
                {Path(p).name for p in counter.opened if not p.endswith(".distcp") and str(root) in p}
            ),
            atime_changed=sum(1 for k in before if after.get(k) != before[k]),
            inferred=_inferred(t.report, t.verification),
            verify_ok=t.verification.ok,
            path=str(root) if keep is not None else "",
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


__all__ = ["BABY", "CkptBenchReport", "build_baby_like", "run_ckpt_bench"]
