"""Allow-list unpickling of the two pickles a torch_dist checkpoint carries.

- `.metadata`: torch DCP's index (dataclasses of torch.distributed.checkpoint, torch.Size, dtypes).
- the common state (`common.pt`, or the `common_state` object inside the shards from megatron-core
  0.19): a dict with `args` (an argparse.Namespace holding Megatron enums, `signal.Signals`, torch
  dtypes) and plain training state.

A pickle can name any importable callable and have it called; a checkpoint downloaded from the Hub is
untrusted input. `SafeUnpickler.find_class` therefore resolves only the globals listed below and refuses
anything else with a CheckpointError naming the global. Megatron classes are replaced by inert stubs
(no Megatron code runs, and megatron-core need not be installed); only when the process has already
imported megatron-core are its Enum classes used as they are, so args print with member names.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import contextlib
import copyreg
import enum
import functools
import gc
import io
import pickle
import signal
import sys
import types
from collections.abc import Callable, Iterator
from typing import IO, Any

from longctx.checkpoint.unpickle_guard import (
    MAX_PICKLE_ELEMENTS,
    GuardedUnpickler,
    Refused,
    Unsafe,
    describe,
    spend,
)
from longctx.errors import CheckpointError

STUB_PREFIXES = ("megatron",)


class _StubMeta(type):
    """Metaclass of stubs: `StubEnum.member` (an enum member pickled by name) gives a named stub."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return cls._named(name)

    def __repr__(cls) -> str:
        return f"<stub {cls._qualname}>"


class MegatronStub(metaclass=_StubMeta):
    """Inert stand-in for a Megatron class found in a pickle (enum member, config dataclass, …).

    Keeps what the pickle gave it (constructor arguments, state) and prints as `Name(args)` or
    `Name.member`; it has no behaviour.
    """

    _qualname = "megatron"
    _args: tuple[Any, ...] = ()
    _kwargs: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance
    _name: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> MegatronStub:
        obj = object.__new__(cls)
        obj.__dict__.update(_args=args, _kwargs=kwargs)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(_args=args, _kwargs=kwargs)

    @classmethod
    def _named(cls, name: str) -> MegatronStub:
        obj = object.__new__(cls)
        obj.__dict__["_name"] = name
        return obj

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict, slots) form
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state

    @property
    def value(self) -> Any:
        """The enum value, when the stub stands for an enum member pickled by value."""
        return self._args[0] if len(self._args) == 1 else None

    @property
    def name(self) -> str | None:
        return self._name

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self._name == other._name
            and self._args == other._args
            and self.fields() == other.fields()
        )

    def __hash__(self) -> int:
        return hash((type(self)._qualname, self._name, repr(self._args)))

    def __repr__(self) -> str:
        short = type(self)._qualname.rsplit(".", 1)[-1]
        if self._name is not None:
            return f"{short}.{self._name}"
        parts = [repr(a) for a in self._args] + [f"{k}={v!r}" for k, v in self._kwargs.items()]
        parts += [f"{k}={v!r}" for k, v in self.fields().items()]
        return f"{short}({', '.join(parts)})"

    __str__ = __repr__


@functools.cache
def _stub_class(module: str, name: str) -> type:
    return _StubMeta(name, (MegatronStub,), {"_qualname": f"{module}.{name}", "__module__": module})


def stub_qualname(obj: Any) -> str | None:
    """`module.Name` of a stub instance or class (None for anything else)."""
    cls = obj if isinstance(obj, _StubMeta) else type(obj)
    return cls._qualname if isinstance(cls, _StubMeta) else None


# ---- guarded callables ------------------------------------------------------------------------------


def _short(obj: Any) -> str:
    """A repr for a message, cut short: the pickle chose the object and can make its repr huge."""
    text = repr(obj)
    return text if len(text) <= 120 else f"{text[:117]}..."


def _safe_reconstructor(cls: Any, base: Any, state: Any) -> Any:
    # copyreg._reconstructor(cls, base, state) calls base.__new__(cls) and base.__init__(obj, state)
    # when base is not object; only plain bases of allowed classes get through.
    if base is not object and base not in (dict, list, set, tuple, int, float, str, bytes):
        raise Refused(f"copyreg._reconstructor with base {_short(base)}")
    return copyreg._reconstructor(cls, base, state)  # type: ignore[attr-defined]


def _safe_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # protocol-2 pickles write bytes as _codecs.encode(str, "latin1")
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise Refused(f"_codecs.encode({type(obj).__name__}, {_short(encoding)})")
    return obj.encode(encoding, errors)


def _safe_getattr(obj: Any, name: Any, *default: Any) -> Any:
    """`getattr(EnumClass, "MEMBER")`: how early 3.11 releases (Debian 12's 3.11.2) pickle an enum member;
    CPython returned to `EnumClass(value)` mid-2023 (gh-105332, after 3.11.4). Only a member of an
    allow-listed enum (or of a Megatron stub, which is inert) is looked up; any other attribute of
    anything is refused."""
    if not isinstance(name, str) or name.startswith("_"):
        raise Refused(f"getattr({_short(obj)}, {_short(name)})")
    if isinstance(obj, _StubMeta):
        return getattr(obj, name)
    if isinstance(obj, type) and issubclass(obj, enum.Enum) and name in obj.__members__:
        return obj.__members__[name]
    raise Refused(f"getattr({_short(obj)}, {_short(name)})")


def _size(a: Any) -> int:
    try:
        return len(a) if hasattr(a, "__len__") else 0
    except (OverflowError, TypeError):
        return MAX_PICKLE_ELEMENTS + 1


def _bounded(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A constructor whose arguments are charged to the pickle's budget before it builds anything."""

    def make(*args: Any, **kwargs: Any) -> Any:
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool):
                spend(factory.__name__, 0, a if factory in (bytes, bytearray) else 0)
            else:
                spend(factory.__name__, _size(a), 0)
        return factory(*args, **kwargs)

    make.__name__ = factory.__name__
    return make


def _safe_range(*args: Any) -> range:
    # a range is lazy, but whatever iterates it (`torch.Size(range(10**9))`, a later walk) is not: its
    # length is charged as if it were built
    r = range(*args)
    spend("range", _size(r), 0)
    return r


def _numpy_reconstruct(reconstruct: Callable[..., Any]) -> Callable[..., Any]:
    """numpy's `_reconstruct(ndarray, shape, dtype)`, with the shape charged before it allocates."""

    def make(subtype: Any, shape: Any, dtype: Any) -> Any:
        import numpy  # resolve_global imported it to give this out

        if subtype is not numpy.ndarray:
            raise Refused(f"numpy _reconstruct of {describe(subtype)}")
        n = 1
        for dim in shape if isinstance(shape, tuple) else (shape,):
            n = min(n * max(int(dim), 0), MAX_PICKLE_ELEMENTS + 1)
        spend("numpy._reconstruct", n, 0)
        return reconstruct(subtype, shape, dtype)

    return make


def _fresh_dtype(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A numpy dtype constructor that returns a new dtype: a builtin one is shared by the whole process
    (`dtype("f8", copy=False)`, `Float64DType()`), and numpy pickles then set its state."""

    def make(*args: Any) -> Any:
        import numpy  # resolve_global imported it to give this out

        return numpy.dtype(factory(*args[:2]), copy=True)

    return make


# ---- the allow-list ---------------------------------------------------------------------------------

_BUILTINS = {
    "set": _bounded(set),
    "frozenset": _bounded(frozenset),
    "complex": complex,
    "bytearray": _bounded(bytearray),
    "slice": slice,
    "range": _safe_range,
    "object": object,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list": _bounded(list),
    "dict": dict,
    "tuple": _bounded(tuple),
    "bytes": _bounded(bytes),
    "getattr": _safe_getattr,
}

_DCP_NAMES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.distributed.checkpoint.planner": (
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData", "LoadPlan",
        "ReadItem", "LoadItemType",
    ),
}  # fmt: skip

_NUMPY_RECONSTRUCT = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}

_TORCH_FUNCS = {
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch.serialization", "_get_layout"),
}


def resolve_global(module: str, name: str, *, stub_megatron: bool | None = None) -> Any:
    """The object a pickle may get for `module.name`, or raise Refused.

    stub_megatron: True → always stubs; False → import megatron-core's enums if possible; None (default)
    → real Enum classes only when megatron-core is already imported in this process.
    """
    if module == "builtins" and name in _BUILTINS:
        return _BUILTINS[name]
    if (module, name) in {("collections", "OrderedDict"), ("collections", "defaultdict")}:
        return getattr(collections, name)
    if (module, name) == ("collections", "deque"):
        return _bounded(collections.deque)
    if (module, name) == ("argparse", "Namespace"):
        return argparse.Namespace
    if module == "signal" and name in ("Signals", "Handlers"):
        return getattr(signal, name)
    if module == "signal" and _signal_member(name) is not None:
        # a module-level member (`signal.SIGTERM`): how early 3.11 releases pickle a global enum's member
        return _signal_member(name)
    if (module, name) == ("copyreg", "_reconstructor"):
        return _safe_reconstructor
    if (module, name) == ("_codecs", "encode"):
        return _safe_encode
    if module == "torch":
        import torch  # only a pickle that names torch loads it: checkpoint/ imports no torch at import

        if name == "Size":
            return torch.Size
        if name == "device":
            return torch.device
        obj = getattr(torch, name, None)
        if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        raise Refused(f"{module}.{name}")
    if (module, name) in _TORCH_FUNCS:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    if name in _DCP_NAMES.get(module, ()):
        mod = __import__(module, fromlist=[name])
        obj = getattr(mod, name, None)
        if obj is not None:
            return obj
        raise Refused(f"{module}.{name}")
    if (module, name) in _NUMPY_RECONSTRUCT or (module == "numpy.dtypes" and name.endswith("DType")):
        obj = getattr(__import__(module, fromlist=[name]), name)
        if name == "_reconstruct":
            return _numpy_reconstruct(obj)
        return _fresh_dtype(obj) if name == "dtype" or name.endswith("DType") else obj
    if module.split(".")[0] in STUB_PREFIXES:
        if name == "MCoreMetadata":
            # megatron-core 0.15 pickled its own Metadata subclass (extra attribute mcore_data)
            from torch.distributed.checkpoint.metadata import Metadata  # torch: only for such pickles

            return Metadata
        real = _real_megatron_enum(module, name, stub_megatron)
        return real if real is not None else _stub_class(module, name)
    raise Refused(f"{module}.{name}")


def _signal_member(name: str) -> enum.Enum | None:
    for cls in (signal.Signals, signal.Handlers):
        member = cls.__members__.get(name)
        if member is not None:
            return member
    return None


def _py2_names(module: str, name: str) -> tuple[str, str]:
    """The Python 3 names of a protocol-2 pickle's Python 2 globals (`__builtin__.getattr`,
    `copy_reg._reconstructor`), as pickle's own `fix_imports` maps them; the allow-list then decides."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _real_megatron_enum(module: str, name: str, stub_megatron: bool | None) -> type | None:
    if stub_megatron is True:
        return None
    mod = sys.modules.get(module)
    if mod is None and stub_megatron is False:
        try:
            mod = __import__(module, fromlist=[name])
        except Exception:  # megatron-core missing or failing to import: stubs do
            mod = None
    obj = getattr(mod, name, None) if mod is not None else None
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return obj
    return None


@functools.cache
def enums_pickled_by_name() -> bool:
    """Whether this interpreter pickles an enum member by name (`getattr(EnumClass, "NAME")`, a global
    enum's member as `module.NAME`), as 3.11.0 to 3.11.4 do. torch's `weights_only` loader, which
    megatron-core uses for common.pt, refuses those pickles, so Megatron-LM running under such a Python
    cannot load the checkpoints it saves (longctx reads them through its own allow-list)."""
    data = pickle.dumps(signal.SIGTERM, protocol=2)
    return b"Signals" not in data


def _refusal(err: Refused, where: str | None) -> CheckpointError:
    if isinstance(err, Unsafe):
        return CheckpointError(
            f"refusing to unpickle: {err}",
            where=where,
            fix="do not load this file: megatron-core and torch never save such a pickle; it is damaged or "
            "crafted, so fetch the checkpoint again from a source you trust",
        )
    return CheckpointError(
        f"refusing to unpickle: the pickle asks for {err}, which is not on the checkpoint reader's "
        "allow-list (argparse.Namespace, Megatron enums, signal.Signals, torch dtypes/tensors, DCP metadata)",
        where=where,
        fix="do not load this file: it is not a plain Megatron checkpoint pickle and may run code",
    )


@functools.cache
def _buildable(cls: type) -> bool:
    """Whether instances of `cls` may get state from a pickle: the plain data types the allow-list gives
    out (Namespace, Megatron stubs, DCP dataclasses, numpy arrays and the fresh dtypes _fresh_dtype makes)."""
    if cls is argparse.Namespace or issubclass(cls, MegatronStub):
        return True
    if cls.__qualname__ in _DCP_NAMES.get(cls.__module__, ()) and not issubclass(cls, enum.Enum):
        return getattr(sys.modules.get(cls.__module__), cls.__qualname__, None) is cls
    numpy = sys.modules.get("numpy")
    return numpy is not None and (cls is numpy.ndarray or issubclass(cls, numpy.dtype))


class SafeUnpickler(GuardedUnpickler):
    """Unpickler that resolves only allow-listed globals (see module docstring) and gives state only to
    new instances of plain data types (see unpickle_guard)."""

    where: str | None = None
    stub_megatron: bool | None = None

    def find_class(self, module: str, name: str) -> Any:
        try:
            return resolve_global(*_py2_names(module, name), stub_megatron=self.stub_megatron)
        except Refused as err:
            raise _refusal(err, self.where) from None

    def may_build(self, cls: type) -> bool:
        return _buildable(cls)

    def check_call(self, func: Any) -> None:
        numpy = sys.modules.get("numpy")
        if numpy is not None and func is numpy.ndarray:  # numpy's own pickles call _reconstruct
            raise Refused("a direct call of numpy.ndarray (an allocation of any size)")


def _bound_unpickler(where: str | None, stub_megatron: bool | None) -> type[SafeUnpickler]:
    return type("BoundSafeUnpickler", (SafeUnpickler,), {"where": where, "stub_megatron": stub_megatron})


def safe_pickle_module(where: str | None = None, stub_megatron: bool | None = None) -> types.ModuleType:
    """A module-like object for `torch.load(pickle_module=…)`."""
    unpickler = _bound_unpickler(where, stub_megatron)
    mod = types.ModuleType("longctx_safe_pickle")
    mod.Unpickler = unpickler  # type: ignore[attr-defined]

    def load(fh: IO[bytes], **kw: Any) -> Any:
        return unpickler(fh, **kw).load()

    mod.load = load  # type: ignore[attr-defined]
    mod.__version__ = pickle.format_version  # type: ignore[attr-defined]
    return mod


def _guarded(where: str | None, what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except CheckpointError:
        raise
    except Refused as err:
        raise _refusal(err, where) from None
    except Exception as err:
        # a guarded callable refusing inside torch.load arrives wrapped; find the cause
        cause: BaseException | None = err
        while cause is not None:
            if isinstance(cause, (Refused, CheckpointError)):
                raise (_refusal(cause, where) if isinstance(cause, Refused) else cause) from None
            cause = cause.__cause__ or cause.__context__
        raise CheckpointError(
            f"cannot read {what}: corrupt or not a pickle ({type(err).__name__}: {str(err)[:300]})",
            where=where,
            fix="re-download or re-copy this file; the checkpoint cannot be used without it",
        ) from None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: unpickling a DCP index creates ~10 objects per stored item
    (400k for a 9B model with optimizer state), and the collections this triggers cost 4-10× the
    unpickling itself. The objects are acyclic; the collector resumes afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def safe_unpickle(
    data: bytes, *, where: str | None = None, what: str = "the pickle", stub_megatron: bool | None = None
) -> Any:
    """Unpickle plain pickle bytes (e.g. `.metadata`) through the allow-list."""
    unpickler = _bound_unpickler(where, stub_megatron)
    with gc_paused():
        return _guarded(where, what, lambda: unpickler(io.BytesIO(data)).load())


def safe_torch_load(
    data: bytes | IO[bytes],
    *,
    where: str | None = None,
    what: str = "the common state",
    stub_megatron: bool | None = None,
) -> Any:
    """`torch.load` (zip or legacy format) with the allow-list unpickler; tensors land on CPU."""
    import torch  # reading common.pt needs torch; checkpoint/ imports no torch at import time

    fh = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    module = safe_pickle_module(where, stub_megatron)
    return _guarded(
        where, what, lambda: torch.load(fh, map_location="cpu", weights_only=False, pickle_module=module)
    )


__all__ = [
    "MegatronStub",
    "SafeUnpickler",
    "enums_pickled_by_name",
    "gc_paused",
    "resolve_global",
    "safe_pickle_module",
    "safe_torch_load",
    "safe_unpickle",
    "stub_qualname",
]
