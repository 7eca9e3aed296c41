"""Read a torch_dist save one tensor (or one slice of a tensor) at a time, with torch DCP's own reader.

megatron-core stacks homogeneous layers into one global tensor `[num_layers, …]` whose chunks are the
layers (and, at TP > 1, the TP slices of each layer). A read asks for a region of a global tensor —
one layer, or the rows of one saved chunk — and DCP's `FileSystemReader` fetches exactly the stored
chunks that overlap it from the shard files, whatever TP the save was made at. Memory is the region
plus the overlapping chunks, never the whole checkpoint.

The `.metadata` index is unpickled here with torch's reader: callers read it first through
`longctx.checkpoint` (`inspect_checkpoint`), whose allow-list refuses unsafe pickles.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from longctx.errors import ExportError


class _RegionPlanner(LoadPlanner):
    """Loads one region (offsets, sizes) of one global tensor into a preallocated buffer."""

    def __init__(self, key: str, offsets: Sequence[int], sizes: Sequence[int], dest: torch.Tensor) -> None:
        self.key = key
        self.chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        self.dest = dest
        self.metadata: Metadata | None = None

    def set_up_planner(
        self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        md = self.metadata.state_dict_metadata[self.key]
        return LoadPlan(create_read_items_for_chunk_list(self.key, md, [self.chunk]))  # type: ignore[arg-type]

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        raise ExportError(f"{self.key} is stored as bytes, not as a tensor")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        t = self.dest
        for dim, (off, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths, strict=True)):
            t = t.narrow(dim, int(off), int(length))
        return t

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor handed out a view of dest: the data is already in place


class DcpReader:
    """Regions of the global tensors of one checkpoint directory (iter_N, release or flat)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._reader = FileSystemReader(str(self.directory))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP warns about its own deprecated internals
            self.metadata: Metadata = self._reader.read_metadata()
            self._reader.set_up_storage_reader(self.metadata, True)
        self.bytes_read = 0
        self.largest_read = 0  # bytes of the largest region held at once

    def keys(self) -> list[str]:
        """Every tensor of the save (bytes objects such as `_extra_state` left out)."""
        return [
            k for k, v in self.metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
        ]

    def meta(self, key: str) -> TensorStorageMetadata:
        md = self.metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise ExportError(f"the checkpoint has no tensor {key!r}", where=str(self.directory))
        return md

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(int(s) for s in self.meta(key).size)

    def row_blocks(self, key: str) -> list[tuple[int, int]]:
        """[start, end) ranges of dim 0 that the saved chunks split the tensor into."""
        md = self.meta(key)
        cuts = {0, int(md.size[0])}
        for c in md.chunks:
            cuts.add(int(c.offsets[0]))
            cuts.add(int(c.offsets[0]) + int(c.sizes[0]))
        points = sorted(cuts)
        return list(itertools.pairwise(points))

    def read(
        self, key: str, offsets: Sequence[int] | None = None, sizes: Sequence[int] | None = None
    ) -> torch.Tensor:
        """The region `offsets`/`sizes` of global tensor `key` (default: all of it)."""
        md = self.meta(key)
        full = tuple(int(s) for s in md.size)
        offsets = tuple(offsets) if offsets is not None else (0,) * len(full)
        sizes = tuple(sizes) if sizes is not None else full
        if len(offsets) != len(full) or any(
            o < 0 or o + s > f for o, s, f in zip(offsets, sizes, full, strict=True)
        ):
            raise ExportError(f"region {offsets}+{sizes} is outside {key} {full}", where=str(self.directory))
        dest = torch.empty(sizes, dtype=md.properties.dtype)
        planner = _RegionPlanner(key, offsets, sizes, dest)
        planner.set_up_planner({}, self.metadata, True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = self._reader.prepare_local_plan(planner.create_local_plan())
            plan = self._reader.prepare_global_plan([plan])[0]
            self._reader.read_data(plan, planner).wait()
        nbytes = dest.numel() * dest.element_size()
        self.bytes_read += nbytes
        self.largest_read = max(self.largest_read, nbytes)
        return dest


__all__ = ["DcpReader"]
