"""Write safetensors files tensor piece by tensor piece, sharded above a size, with the index JSON.

The safetensors format: an 8-byte little-endian header length N, N bytes of JSON (per tensor its
dtype, shape and [begin, end) byte offsets into the data that follows; `__metadata__` free-form
strings), then the tensors' bytes, C-contiguous and little-endian, in offset order with no gaps. Every
shape is known before the first byte is written (from the checkpoint's metadata), so each header is
written first and the data streamed after it: memory is one piece, not one shard.

Shards follow transformers' names (`model-00001-of-00003.safetensors` + `model.safetensors.index.json`
with `metadata.total_size` and `weight_map`); a model that fits one shard is `model.safetensors`.
A tensor is never split across shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import torch

from longctx.errors import ExportError
from longctx.export.mapping import HfTensor
from longctx.util.fs import atomic_write_json

SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclasses.dataclass
class _Entry:
    tensor: HfTensor
    shard: int
    begin: int  # byte offset in its shard's data section
    nbytes: int


@dataclasses.dataclass
class Shard:
    name: str
    tensors: list[str]
    nbytes: int


def layout(
    tensors: Sequence[HfTensor], itemsize: int, max_shard_bytes: int
) -> tuple[list[Shard], list[_Entry]]:
    """Assign tensors (in order) to shards of at most `max_shard_bytes` (a larger tensor gets its own)."""
    groups: list[list[HfTensor]] = [[]]
    size = 0
    for t in tensors:
        n = t.numel * itemsize
        if groups[-1] and size + n > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += n
    count = len(groups)
    shards: list[Shard] = []
    entries: list[_Entry] = []
    for k, group in enumerate(groups):
        name = SINGLE_NAME if count == 1 else f"model-{k + 1:05d}-of-{count:05d}.safetensors"
        offset = 0
        for t in group:
            n = t.numel * itemsize
            entries.append(_Entry(t, k, offset, n))
            offset += n
        shards.append(Shard(name, [t.name for t in group], offset))
    return shards, entries


def _header(entries: Sequence[_Entry], dtype: torch.dtype) -> bytes:
    head: dict[str, object] = {"__metadata__": {"format": "pt"}}
    for e in entries:
        head[e.tensor.name] = {
            "dtype": SAFETENSORS_DTYPE[dtype],
            "shape": list(e.tensor.shape),
            "data_offsets": [e.begin, e.begin + e.nbytes],
        }
    raw = json.dumps(head, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw


class SafetensorsWriter:
    """`write(name, piece)` in file order (pieces of one tensor are consecutive rows); then `close()`."""

    def __init__(
        self, out_dir: Path, tensors: Sequence[HfTensor], dtype: torch.dtype, max_shard_bytes: int
    ) -> None:
        if dtype not in SAFETENSORS_DTYPE:
            raise ExportError(f"cannot write {dtype} weights", fix="use bfloat16, float16 or float32")
        if sys.byteorder != "little":
            raise ExportError("safetensors stores little-endian data; this machine is big-endian")
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise ExportError("duplicate tensor names in the export plan")
        self.out_dir = out_dir
        self.dtype = dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.shards, self._entries = layout(tensors, self.itemsize, max_shard_bytes)
        self._pos = 0  # the entry being written
        self._written = 0  # bytes of it written so far
        self._fh: IO[bytes] | None = None
        self._shard = -1

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def _open(self, k: int) -> None:
        self._close_file()
        self._shard = k
        self._fh = open(self.out_dir / self.shards[k].name, "wb")  # noqa: SIM115 (closed in _close_file)
        self._fh.write(_header([e for e in self._entries if e.shard == k], self.dtype))

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def write(self, name: str, piece: torch.Tensor) -> int:
        """Append `piece` (the next rows of tensor `name`); returns the bytes written."""
        if self._pos >= len(self._entries):
            raise ExportError(f"{name}: every tensor of the layout is already written")
        entry = self._entries[self._pos]
        if name != entry.tensor.name:
            raise ExportError(f"{name} written out of order: {entry.tensor.name} comes next")
        if entry.shard != self._shard:
            self._open(entry.shard)
        data = piece.detach().to(self.dtype).contiguous().reshape(-1)
        nbytes = data.numel() * self.itemsize
        if self._written + nbytes > entry.nbytes:
            raise ExportError(f"{name}: more data than its shape {list(entry.tensor.shape)} holds")
        assert self._fh is not None
        self._fh.write(memoryview(data.view(torch.uint8).numpy()))
        self._written += nbytes
        if self._written == entry.nbytes:
            self._pos += 1
            self._written = 0
        return nbytes

    def close(self) -> list[str]:
        """Finish the files (and the index for several shards); the file names written."""
        if self._pos != len(self._entries):
            missing = self._entries[self._pos].tensor.name
            raise ExportError(f"the export ended before {missing} was written")
        self._close_file()
        files = [s.name for s in self.shards]
        if len(self.shards) > 1:
            weight_map = {t: s.name for s in self.shards for t in s.tensors}
            atomic_write_json(
                self.out_dir / INDEX_NAME,
                {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map},
            )
            files.append(INDEX_NAME)
        return files

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


__all__ = ["INDEX_NAME", "SAFETENSORS_DTYPE", "SINGLE_NAME", "SafetensorsWriter", "Shard", "layout"]
