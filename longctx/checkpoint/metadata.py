"""What a torch_dist checkpoint directory says about itself, read without loading any tensor.

- `metadata.json`: backend and version; its `common_backend` fields exist up to megatron-core 0.18.
- `.metadata`: torch DCP's pickled `Metadata` — every tensor's global shape, dtype and chunks, and for
  every stored item the shard file, offset and length (`storage_data`). Unpickled through the
  allow-list of `unpickle.py`.
- the common state: `common.pt` (≤ 0.18), else the DCP object `common_state/shard_0_1` (≥ 0.19), a
  `torch.save`d list holding the dict; reading it touches only that object's byte range.
"""

from __future__ import annotations

import collections
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from longctx.checkpoint.save_layout import COMMON_PT, DCP_METADATA, METADATA_JSON
from longctx.checkpoint.tree import Tree, join
from longctx.checkpoint.unpickle import gc_paused, safe_torch_load, safe_unpickle
from longctx.errors import CheckpointError

COMMON_STATE_KEY = "common_state/shard_0_1"

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
}  # fmt: skip

Era = Literal["common.pt", "common_state", "unknown"]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the checkpoint: global shape (TP-agnostic), dtype and how many chunks store it."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    chunks: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class ItemLocation:
    file: str
    offset: int
    length: int


@dataclass
class FileExtent:
    """What `.metadata` expects of one shard file: it must be at least `min_size` bytes."""

    file: str
    min_size: int = 0
    items: int = 0


@dataclass
class DcpIndex:
    """The content of `.metadata`, reduced to plain data."""

    tensors: dict[str, TensorInfo]
    bytes_keys: list[str]
    files: dict[str, FileExtent]
    bytes_locations: dict[str, ItemLocation]
    version: str | None
    metadata_class: str
    mcore_data: Any = None

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


_CACHE: collections.OrderedDict[tuple[Any, ...], DcpIndex] = collections.OrderedDict()
_CACHE_SIZE = 4


def _cache_key(tree: Tree, path: str, stub_megatron: bool | None) -> tuple[Any, ...]:
    r = tree.byte_range(path)
    st = os.stat(r.path)
    return (str(r.path), r.offset, r.length, st.st_ino, st.st_size, st.st_mtime_ns, stub_megatron)


def read_dcp_index(tree: Tree, rel: str, *, stub_megatron: bool | None = None) -> DcpIndex:
    """Read and summarise `.metadata` of checkpoint dir `rel` (raises CheckpointError if missing/corrupt).

    The summary of an unchanged file (same inode, size and mtime) is reused within the process, so
    inspect followed by verify unpickles a large index once. Treat the result as read-only.
    """
    path = join(rel, DCP_METADATA)
    if tree.is_file(path):
        key = _cache_key(tree, path, stub_megatron)
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        with gc_paused():
            index = _read_dcp_index(tree, rel, stub_megatron)
        _CACHE[key] = index
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return index
    return _read_dcp_index(tree, rel, stub_megatron)


def clear_index_cache() -> None:
    _CACHE.clear()


def _check_shard_entry(rel_path: str, offset: int, length: int, where: str) -> None:
    """A storage entry names a shard file *in* the checkpoint directory (torch DCP writes bare file
    names) and a byte range within it; anything else would make readers look outside the checkpoint."""
    name_ok = rel_path not in ("", ".", "..") and "/" not in rel_path and "\\" not in rel_path
    if not name_ok:
        raise CheckpointError(
            f"the DCP index names shard file {rel_path!r}, which is not a file of the checkpoint directory",
            where=where,
            fix="the .metadata is corrupt or was edited: re-download or re-copy the checkpoint",
        )
    if offset < 0 or length < 0:
        raise CheckpointError(
            f"the DCP index gives shard {rel_path!r} a negative byte range (offset {offset}, length {length})",
            where=where,
            fix="the .metadata is corrupt or was edited: re-download or re-copy the checkpoint",
        )


def _read_dcp_index(tree: Tree, rel: str, stub_megatron: bool | None) -> DcpIndex:
    path = join(rel, DCP_METADATA)
    where = tree.where(path)
    if not tree.is_file(path):
        raise CheckpointError(
            "no .metadata (torch DCP index) in the checkpoint directory",
            where=tree.where(rel),
            fix="the save did not finish or the download is incomplete: fetch the .metadata file again",
        )
    md = safe_unpickle(
        tree.read_bytes(path), where=where, what="the DCP index (.metadata)", stub_megatron=stub_megatron
    )
    sdm = getattr(md, "state_dict_metadata", None)
    storage = getattr(md, "storage_data", None)
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise CheckpointError(
            f"corrupt .metadata: it holds a {type(md).__name__}, not torch DCP Metadata with "
            "state_dict_metadata and storage_data",
            where=where,
            fix="re-download or re-copy the file; the checkpoint cannot be used without it",
        )
    tensors: dict[str, TensorInfo] = {}
    bytes_keys: list[str] = []
    for key, entry in sdm.items():
        size = getattr(entry, "size", None)
        props = getattr(entry, "properties", None)
        if size is not None and props is not None:
            tensors[key] = TensorInfo(
                key=key,
                shape=tuple(int(s) for s in size),
                dtype=_dtype_name(getattr(props, "dtype", "")),
                chunks=len(getattr(entry, "chunks", ()) or ()),
            )
        else:
            bytes_keys.append(key)
    files: dict[str, FileExtent] = {}
    bytes_locations: dict[str, ItemLocation] = {}
    bytes_set = set(bytes_keys)
    for index, info in storage.items():
        rp = str(getattr(info, "relative_path", ""))
        off, length = int(getattr(info, "offset", 0)), int(getattr(info, "length", 0))
        _check_shard_entry(rp, off, length, where)
        ext = files.get(rp)
        if ext is None:
            ext = files[rp] = FileExtent(rp)
        ext.items += 1
        if off + length > ext.min_size:
            ext.min_size = off + length
        fqn = getattr(index, "fqn", None)
        if fqn in bytes_set:
            bytes_locations[fqn] = ItemLocation(rp, off, length)
    return DcpIndex(
        tensors=tensors,
        bytes_keys=bytes_keys,
        files=files,
        bytes_locations=bytes_locations,
        version=getattr(md, "version", None),
        metadata_class=type(md).__name__,
        mcore_data=getattr(md, "mcore_data", None),
    )


@dataclass
class BackendInfo:
    """`metadata.json`: which sharded backend wrote the checkpoint."""

    sharded_backend: str | None = None
    sharded_backend_version: int | None = None
    common_backend: str | None = None
    common_backend_version: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def read_backend(tree: Tree, rel: str) -> BackendInfo | None:
    """Parse metadata.json (None when absent; CheckpointError when not JSON)."""
    path = join(rel, METADATA_JSON)
    if not tree.is_file(path):
        return None
    try:
        raw = json.loads(tree.read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"metadata.json is not valid JSON ({err})",
            where=tree.where(path),
            fix="re-download or re-copy it; megatron-core writes it last, after every shard",
        ) from None
    if not isinstance(raw, dict):
        raise CheckpointError("metadata.json is not a JSON object", where=tree.where(path))
    return BackendInfo(
        sharded_backend=raw.get("sharded_backend"),
        sharded_backend_version=raw.get("sharded_backend_version"),
        common_backend=raw.get("common_backend"),
        common_backend_version=raw.get("common_backend_version"),
        raw=raw,
    )


@dataclass
class CommonState:
    era: Era
    state: dict[str, Any] | None
    where: str | None


def read_common_state(
    tree: Tree, rel: str, index: DcpIndex | None, *, stub_megatron: bool | None = None
) -> CommonState:
    """The common state dict: `common.pt` when present (≤ 0.18), else the DCP object `common_state`
    (≥ 0.19; the index is read here when the caller has none, so no reader misses that era)."""
    pt = join(rel, COMMON_PT)
    if tree.is_file(pt):
        where = tree.where(pt)
        state = safe_torch_load(
            tree.read_bytes(pt), where=where, what="common.pt", stub_megatron=stub_megatron
        )
        return CommonState("common.pt", _as_dict(state, where), where)
    if index is None and tree.is_file(join(rel, DCP_METADATA)):
        index = read_dcp_index(tree, rel, stub_megatron=stub_megatron)
    if index is not None and COMMON_STATE_KEY in index.bytes_locations:
        loc = index.bytes_locations[COMMON_STATE_KEY]
        shard = join(rel, loc.file)
        where = f"{tree.where(shard)}@{loc.offset}+{loc.length} ({COMMON_STATE_KEY})"
        if not tree.is_file(shard):
            raise CheckpointError(
                f"the shard holding {COMMON_STATE_KEY} is missing",
                where=tree.where(shard),
                fix="re-download the missing shard file",
            )
        data = tree.read_bytes(shard, loc.offset, loc.length)
        state = safe_torch_load(data, where=where, what=COMMON_STATE_KEY, stub_megatron=stub_megatron)
        # megatron-core stores a ShardedObject's data as torch.save([data])
        if isinstance(state, list) and len(state) == 1:
            state = state[0]
        return CommonState("common_state", _as_dict(state, where), where)
    return CommonState("unknown", None, None)


def _as_dict(state: Any, where: str) -> dict[str, Any]:
    if not isinstance(state, dict):
        raise CheckpointError(
            f"the common state is a {type(state).__name__}, not a dict",
            where=where,
            fix="this is not a Megatron-LM checkpoint's common state",
        )
    return state


def args_dict(common: dict[str, Any] | None) -> dict[str, Any]:
    """The saved Megatron args as a plain dict ({} when the checkpoint carries none)."""
    if not common:
        return {}
    args = common.get("args")
    if args is None:
        return {}
    if isinstance(args, dict):
        return dict(args)
    return dict(vars(args)) if hasattr(args, "__dict__") else {}


__all__ = [
    "COMMON_STATE_KEY",
    "BackendInfo",
    "CommonState",
    "DcpIndex",
    "FileExtent",
    "ItemLocation",
    "TensorInfo",
    "args_dict",
    "clear_index_cache",
    "read_backend",
    "read_common_state",
    "read_dcp_index",
]
