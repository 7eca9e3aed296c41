"""The machine the allow-list reader unpickles on: the standard library's Python unpickler with every
opcode that writes state, hands out a memo reference or nests an object checked before it acts.

`find_class` alone (all the C unpickler lets a caller hook) chooses the globals, not what is done with them:
- BUILD writes state onto whatever object is on the stack: an allow-listed class (`argparse.Namespace`
  itself), a function, an enum member the whole process shares. `(None, {"__getattribute__": getattr})`
  built onto the class breaks every later read in the process. Here BUILD sets public data attributes of
  instances of the data types the subclass names (`may_build`), and nothing else.
- A memo reference hands out an object already built for two bytes: 40 levels of `[x, x]` are 80
  objects to the unpickler and 2**40 to any code that walks, copies or prints the result. Here a
  reference costs what it makes reachable (objects, long strings by length) from one budget per pickle,
  and an object is never changed after a reference handed it out, so the cost charged stays true (this
  also refuses cyclic structures, which no Megatron or DCP pickle holds).
- Nesting is bounded, so code that walks the result recursively stays far from Python's recursion limit.

The price is speed: the Python machine is about ten times slower than the C one (the DCP index of a 9B
model with optimizer state, 1.8M opcodes, takes about 1.3 s of CPU instead of 0.1 s).
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import io
import pickle
import struct
import types
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from longctx.errors import LongctxError

# What one pickle may build through constructor calls: pickle opcodes build objects in proportion to the
# bytes they take, except a constructor called with a count (`bytearray(10**9)`), a lazy range
# (`list(range(10**9))`) or a copy of something already built: 61 bytes of pickle would otherwise
# allocate gigabytes. The budget is per pickle (one `load`), not per call.
MAX_PICKLE_BYTES = 1 << 28
MAX_PICKLE_ELEMENTS = 1 << 22
# Objects one pickle may hand out, counting each memo reference as everything reachable through it: a
# base plus a few per byte, so that no pickle stands for much more than its own size. Plain pickles hand
# out less than one object per byte (the DCP index of a 9B model with optimizer state at DP 256: 1.3M
# from 3.8 MB); 300 bytes of nested memo references can stand for 2**40.
PICKLE_OBJECTS_BASE = 1 << 20
PICKLE_OBJECTS_PER_BYTE = 8
MAX_PICKLE_DEPTH = 100  # a DCP index nests 10 deep, a Megatron common state less
# The widest integer LONG4 may carry. Pickles of sizes, offsets and RNG states hold ints of 64 bits or less
# (LONG1 carries up to 255 bytes); an int of megabytes costs nothing to load but raises ValueError in any
# `str()` or f-string later (Python's 4,300-digit limit), far from the guard. 1 KiB is under 2,500 digits.
MAX_LONG_BYTES = 1024
_LEAF_UNIT = 64  # bytes of a string or bytes object that count as one object
_MISSING = object()
_UINT32 = struct.Struct("<I")


class Refused(Exception):
    """A global or a guarded call outside the allow-list (the message names what the pickle asks for)."""


class Unsafe(Refused):
    """A pickle that writes where it may not, or hands out more than its budget (the message says what)."""


@dataclass
class Budget:
    """What constructor calls may still build in the pickle being loaded."""

    elements: int = MAX_PICKLE_ELEMENTS
    nbytes: int = MAX_PICKLE_BYTES


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("longctx_pickle_budget", default=None)


def spend(name: str, elements: int, nbytes: int) -> None:
    """Take a constructor call's elements and bytes from the current pickle's budget (Unsafe when spent)."""
    if elements > MAX_PICKLE_ELEMENTS:
        raise Unsafe(f"a call {name}(…) of {elements:,}+ elements, more than {MAX_PICKLE_ELEMENTS:,}")
    if nbytes > MAX_PICKLE_BYTES:
        raise Unsafe(f"a call {name}({nbytes}), more than {MAX_PICKLE_BYTES:,} bytes")
    budget = _BUDGET.get()
    if budget is None:
        return
    budget.elements -= elements
    budget.nbytes -= nbytes
    if budget.elements < 0 or budget.nbytes < 0:
        raise Unsafe(
            f"constructor calls ({name}(…) the last) that build more than {MAX_PICKLE_ELEMENTS:,} elements or "
            f"{MAX_PICKLE_BYTES:,} bytes in all"
        )


def describe(obj: Any) -> str:
    """What an object is, without its repr (which a hostile pickle controls and can make huge)."""
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return f"the module {obj.__name__}"
    if callable(obj):
        return f"the function {getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"
    cls = type(obj)
    return f"an instance of {cls.__module__}.{cls.__qualname__}"


def _units(obj: Any) -> int:
    """How many objects a call's result stands for by its own size (0 for anything but builtin containers
    and strings)."""
    if isinstance(obj, (str, bytes, bytearray)):
        return len(obj) // _LEAF_UNIT
    if isinstance(obj, (list, tuple, dict, set, frozenset, range, collections.deque)):
        try:
            return len(obj)
        except OverflowError:  # a range beyond sys.maxsize
            return MAX_PICKLE_ELEMENTS + 1
    return 0


def _state_dicts(state: Any) -> list[dict[Any, Any]] | None:
    """The attribute dicts of a BUILD state: `{attrs}` or `({attrs} | None, {slots} | None)`; None when the
    state has neither form (only a type's own `__setstate__` may take it)."""
    if isinstance(state, dict):
        return [state]
    if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
        return [s for s in state if s]
    return None


# The container types each filling opcode may change: anything else (a tensor, a class, a stub) is refused.
_APPENDABLE = (list, collections.deque)
_SETTABLE = (dict, collections.OrderedDict, collections.defaultdict)
_ADDABLE = (set,)


class _Stop(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class GuardedUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """Python unpickler whose state writes, memo references, calls and nesting are checked (see module doc).

    Subclasses choose the globals (`find_class`), which instances may get state (`may_build`) and which
    objects may be called (`check_call`). The file must be seekable: the pickle is read into memory (the
    standard frame reader costs a Python call per read) and the file is left just after its end."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, file: IO[bytes], **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._source = file

    def may_build(self, cls: type) -> bool:
        """Whether BUILD may set attributes of an instance of `cls` (only plain data types should allow it:
        a class, a function or a module is an instance of `type`, a function type, `ModuleType`)."""
        return False

    def check_call(self, func: Any) -> None:
        """Raise Refused when the pickle may not call `func` (REDUCE, NEWOBJ, OBJ, INST)."""

    def load(self) -> Any:
        """Read one pickle from the file, with its own budgets; Refused (or the subclass's error) when the
        pickle does what this machine refuses."""
        source = self._source
        start = source.tell()
        buf = io.BytesIO(source.read())
        self.read, self.readline, self.readinto = buf.read, buf.readline, buf.readinto
        self._end = len(buf.getvalue())
        self.metastack: list[list[Any]] = []
        self.stack: list[Any] = []
        self.append = self.stack.append
        self.proto = 0
        # per id: (the object, kept alive so that the id stays its own; objects reachable through it; depth)
        self._meta: dict[int, tuple[Any, int, int]] = {}
        self._shared: set[int] = set()  # ids a memo reference handed out: never changed afterwards
        self._held: list[Any] = []
        self._plans: dict[type, tuple[bool, Any]] = {}  # per class BUILD meets: (may_build, __setstate__)
        self._left = self._budget_objects = PICKLE_OBJECTS_BASE + PICKLE_OBJECTS_PER_BYTE * self._end
        token = _BUDGET.set(Budget())
        read, dispatch = buf.read, self.dispatch
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError
                dispatch[key[0]](self)
        except _Stop as stop:
            return stop.value
        except (Refused, LongctxError):
            raise
        except Exception as err:
            if buf.tell() >= self._end:  # a short read, whichever opcode met it
                raise pickle.UnpicklingError("pickle data was truncated") from err
            raise
        finally:
            source.seek(start + buf.tell())
            _BUDGET.reset(token)
            self._meta, self._shared, self._held, self._plans = {}, set(), [], {}

    # ---- accounting ----------------------------------------------------------------------------------

    def _note(self, obj: Any, weight: int, depth: int, new: int) -> None:
        """Record what `obj` makes reachable and how deep it nests; charge the `new` objects it adds."""
        if depth > MAX_PICKLE_DEPTH:
            raise Unsafe(f"objects nested more than {MAX_PICKLE_DEPTH} deep")
        self._meta[id(obj)] = (obj, weight, depth)
        self._left -= new
        if self._left < 0:
            raise self._exhausted()

    def _exhausted(self) -> Unsafe:
        return Unsafe(
            f"more than {self._budget_objects:,} objects in all ({PICKLE_OBJECTS_BASE:,} + "
            f"{PICKLE_OBJECTS_PER_BYTE} per byte of the pickle), counting each memo reference as every object "
            "it makes reachable (a few bytes of references can stand for a structure exponentially larger)"
        )

    def _container(self, obj: Any, items: list[Any] | tuple[Any, ...]) -> None:
        """Account a new container of `items`."""
        if items:
            self._add(obj, items, len(items) + 1, 1)

    def _grow(self, target: Any, items: list[Any] | tuple[Any, ...]) -> None:
        """Account `items` added to `target`."""
        had = self._meta.get(id(target))
        if had is None:
            self._add(target, items, len(items) + 1, 1)
        else:
            self._add(target, items, len(items) + had[1], had[2] or 1)

    def _add(self, obj: Any, items: list[Any] | tuple[Any, ...], weight: int, depth: int) -> None:
        """_note for a container holding `items` besides what `weight` and `depth` already count."""
        meta = self._meta
        for m in filter(None, map(meta.get, map(id, items))):
            weight += m[1] - 1
            if m[2] >= depth:
                depth = m[2] + 1
        if depth > MAX_PICKLE_DEPTH:
            raise Unsafe(f"objects nested more than {MAX_PICKLE_DEPTH} deep")
        meta[id(obj)] = (obj, weight, depth)
        self._left -= len(items)
        if self._left < 0:
            raise self._exhausted()

    def _put(self, obj: Any, item: Any) -> None:
        """_grow by one item (BUILD's state, APPEND's value), or a new container of one (TUPLE1)."""
        meta = self._meta
        had, m = meta.get(id(obj)), meta.get(id(item))
        weight, depth = (2, 1) if had is None else (had[1] + 1, had[2] or 1)
        if m is not None:
            weight += m[1] - 1
            if m[2] >= depth:
                depth = m[2] + 1
                if depth > MAX_PICKLE_DEPTH:
                    raise Unsafe(f"objects nested more than {MAX_PICKLE_DEPTH} deep")
        meta[id(obj)] = (obj, weight, depth)
        self._left -= 1
        if self._left < 0:
            raise self._exhausted()

    def _made(self, result: Any, args: Any) -> None:
        """Account a call's result: it stands for its arguments (already charged), or for its own size when
        that is larger (`list(range(n))`, charged the difference)."""
        m = self._meta.get(id(args))
        given, depth = (1, 0) if m is None else (m[1], m[2])
        weight = max(given, 1 + _units(result))
        if weight > 1 or depth > 0:
            self._note(result, weight, depth, weight - given)

    def _refer(self, obj: Any) -> None:
        """Push an object a reference hands out again, charging everything reachable through it."""
        m = self._meta.get(id(obj))
        if m is not None:
            self._left -= m[1]
            if self._left < 0:
                raise self._exhausted()
        self._shared.add(id(obj))
        self.append(obj)

    def _changeable(self, target: Any, kinds: tuple[type, ...], op: str) -> None:
        if type(target) not in kinds:
            raise Unsafe(
                f"{op} onto {describe(target)}: only {', '.join(k.__name__ for k in kinds)} may be filled"
            )
        if id(target) in self._shared:
            raise Unsafe(
                f"{op} changes a {type(target).__name__} that a memo reference already handed out "
                "(a cyclic or self-modifying structure)"
            )

    # ---- opcodes that build containers -------------------------------------------------------------

    def load_tuple(self) -> None:
        t = tuple(self.pop_mark())
        self.append(t)
        self._container(t, t)

    def load_tuple1(self) -> None:
        t = (self.stack[-1],)
        self.stack[-1] = t
        self._put(t, t[0])

    def load_tuple2(self) -> None:
        stack = self.stack
        t = (stack[-2], stack[-1])
        stack[-2:] = [t]
        self._container(t, t)

    def load_tuple3(self) -> None:
        stack = self.stack
        t = (stack[-3], stack[-2], stack[-1])
        stack[-3:] = [t]
        self._container(t, t)

    def load_list(self) -> None:
        items = self.pop_mark()
        self.append(items)
        self._container(items, items)

    def load_dict(self) -> None:
        items = self.pop_mark()
        d = {items[i]: items[i + 1] for i in range(0, len(items), 2)}
        self.append(d)
        self._container(d, items)

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        s = frozenset(items)
        self.append(s)
        self._container(s, items)

    def load_bytearray8(self) -> None:
        (n,) = struct.unpack("<Q", self.read(8))
        if n > self._end:  # bytearray(n) zero-fills: refuse before allocating what the pickle cannot hold
            raise pickle.UnpicklingError(f"BYTEARRAY8 of {n:,} bytes in a pickle of {self._end:,}")
        b = bytearray(n)
        self.readinto(b)
        self.append(b)
        self._made(b, ())

    def load_mark(self) -> None:
        # each open MARK is a container still being built inside the one before it: nesting too
        if len(self.metastack) >= MAX_PICKLE_DEPTH:
            raise Unsafe(f"objects nested more than {MAX_PICKLE_DEPTH} deep (MARKs left open)")
        self.metastack.append(self.stack)
        self.stack = []
        self.append = self.stack.append

    def load_frame(self) -> None:
        self.read(8)  # frames only group reads; the pickle is in memory already

    def load_stop(self) -> None:
        raise _Stop(self.stack.pop())

    # ---- opcodes that fill a container on the stack ------------------------------------------------

    def load_append(self) -> None:
        value = self.stack.pop()
        target = self.stack[-1]
        self._changeable(target, _APPENDABLE, "APPEND")
        target.append(value)
        self._put(target, value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        self._changeable(target, _APPENDABLE, "APPENDS")
        target.extend(items)
        self._grow(target, items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        target = self.stack[-1]
        self._changeable(target, _SETTABLE, "SETITEM")
        target[key] = value
        self._grow(target, (key, value))

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not dict or id(target) in self._shared:
            self._changeable(target, _SETTABLE, "SETITEMS")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]
        self._grow(target, items)

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        self._changeable(target, _ADDABLE, "ADDITEMS")
        target.update(items)
        self._grow(target, items)

    # ---- state -------------------------------------------------------------------------------------

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        cls = type(inst)
        plan = self._plans.get(cls)
        if plan is None:
            plan = self._plans[cls] = (self.may_build(cls), getattr(cls, "__setstate__", None))
        if not plan[0]:
            raise Unsafe(
                f"BUILD (set state) onto {describe(inst)}: state may go only onto new instances of the "
                "allow-listed data types, never onto a class, a function, a module or a shared object"
            )
        if id(inst) in self._shared:
            raise Unsafe(f"BUILD onto {describe(inst)} that a memo reference already handed out")
        dicts = _state_dicts(state)
        for attrs in dicts or ():
            for key in attrs:
                if type(key) is not str or not _plain_attribute(cls, key):
                    raise _bad_attribute(inst, key)
        if plan[1] is not None:
            plan[1](inst, state)
        elif dicts is None:
            raise Unsafe(f"BUILD onto {describe(inst)} with a {type(state).__name__} state, not attributes")
        else:
            attrs, slots = state if isinstance(state, tuple) else (state, None)
            if attrs:
                inst.__dict__.update(attrs)
            for key, value in (slots or {}).items():
                setattr(inst, key, value)
        self._put(inst, state)

    # ---- calls -------------------------------------------------------------------------------------

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if type(args) is not tuple:
            raise pickle.UnpicklingError("REDUCE arguments are not a tuple")
        self.check_call(func)
        stack[-1] = result = func(*args)
        self._made(result, args)
        self._aliased(result, args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple:
            raise pickle.UnpicklingError("NEWOBJ needs a class and an argument tuple")
        self.check_call(cls)
        obj = cls.__new__(cls, *args)
        self.append(obj)
        if args:
            self._made(obj, args)

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple or type(kwargs) is not dict:
            raise pickle.UnpicklingError("NEWOBJ_EX needs a class, an argument tuple and a keyword dict")
        self.check_call(cls)
        obj = cls.__new__(cls, *args, **kwargs)
        self.append(obj)
        self._made(obj, args)
        self._put(obj, kwargs)

    def _instantiate(self, klass: Any, args: list[Any]) -> None:  # OBJ and INST
        self.check_call(klass)
        super()._instantiate(klass, args)
        self._made(self.stack[-1], args)
        self._aliased(self.stack[-1], args)

    def _aliased(self, result: Any, args: tuple[Any, ...] | list[Any]) -> None:
        """A call that returned one of its arguments (`tuple(t)` is `t`) leaves that object held twice,
        inside the argument tuple and on the stack: as after a reference, it may no longer change."""
        if any(a is result for a in args):
            self._shared.add(id(result))
            self._held.append(result)

    # ---- references --------------------------------------------------------------------------------

    def _memo(self, i: int) -> Any:
        try:
            return self.memo[i]
        except KeyError:
            raise pickle.UnpicklingError(f"Memo value not found at index {i}") from None

    def load_get(self) -> None:
        self._refer(self._memo(int(self.readline()[:-1])))

    def load_binget(self) -> None:  # inlines _refer: a DCP index holds a memo reference per stored item
        i = self.read(1)[0]
        obj = self.memo.get(i, _MISSING)
        if obj is _MISSING:
            self._memo(i)
        m = self._meta.get(id(obj))
        if m is not None:
            self._left -= m[1]
            if self._left < 0:
                raise self._exhausted()
        self._shared.add(id(obj))
        self.append(obj)

    def load_long_binget(self) -> None:
        i = _UINT32.unpack(self.read(4))[0]
        obj = self.memo.get(i, _MISSING)
        if obj is _MISSING:
            self._memo(i)
        m = self._meta.get(id(obj))
        if m is not None:
            self._left -= m[1]
            if self._left < 0:
                raise self._exhausted()
        self._shared.add(id(obj))
        self.append(obj)

    def load_dup(self) -> None:
        self._held.append(self.stack[-1])  # keeps its id its own while it is marked shared
        self._refer(self.stack[-1])

    def load_ext(self) -> None:
        raise Refused("an extension code (EXT1/EXT2/EXT4: copyreg's registry)")

    def load_long4(self) -> None:
        n = _UINT32.unpack(self.read(4))[0]
        if n > MAX_LONG_BYTES:
            raise Unsafe(f"an integer of {n:,} bytes (LONG4), more than {MAX_LONG_BYTES:,}")
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(pickle.decode_long(data))

    for _op, _fn in {
        pickle.TUPLE: load_tuple,
        pickle.TUPLE1: load_tuple1,
        pickle.TUPLE2: load_tuple2,
        pickle.TUPLE3: load_tuple3,
        pickle.LIST: load_list,
        pickle.DICT: load_dict,
        pickle.FROZENSET: load_frozenset,
        pickle.BYTEARRAY8: load_bytearray8,
        pickle.MARK: load_mark,
        pickle.FRAME: load_frame,
        pickle.STOP: load_stop,
        pickle.APPEND: load_append,
        pickle.APPENDS: load_appends,
        pickle.SETITEM: load_setitem,
        pickle.SETITEMS: load_setitems,
        pickle.ADDITEMS: load_additems,
        pickle.BUILD: load_build,
        pickle.REDUCE: load_reduce,
        pickle.NEWOBJ: load_newobj,
        pickle.NEWOBJ_EX: load_newobj_ex,
        pickle.GET: load_get,
        pickle.BINGET: load_binget,
        pickle.LONG_BINGET: load_long_binget,
        pickle.DUP: load_dup,
        pickle.EXT1: load_ext,
        pickle.EXT2: load_ext,
        pickle.EXT4: load_ext,
        pickle.LONG4: load_long4,
    }.items():
        dispatch[_op[0]] = _fn
    del _op, _fn


@functools.lru_cache(maxsize=4096)
def _plain_attribute(cls: type, name: str) -> bool:
    """Whether BUILD may set `name` on an instance of `cls`: a public identifier that shadows no behaviour
    (a method, a classmethod, a nested class); data attributes and properties, which an instance's dict
    cannot shadow, may be set."""
    if not name.isidentifier() or name.startswith("_"):
        return False
    attr = inspect.getattr_static(cls, name, None)
    if attr is None:
        return True
    kind = type(attr)
    return not callable(attr) and not (hasattr(kind, "__get__") and not hasattr(kind, "__set__"))


def _bad_attribute(inst: Any, key: Any) -> Unsafe:
    shown = repr(key[:80]) if isinstance(key, str) else f"a {type(key).__name__} key"
    return Unsafe(
        f"BUILD sets attribute {shown} of {describe(inst)}: only public data attributes may be set "
        "(no dunder or private name, nothing that replaces a method)"
    )


def _sized_leaf(base: Any) -> Any:
    """An opcode loading a string or bytes, which then counts one object per _LEAF_UNIT bytes."""

    def load(self: GuardedUnpickler) -> None:
        base(self)
        leaf = self.stack[-1]
        if len(leaf) >= _LEAF_UNIT:
            self._meta[id(leaf)] = (leaf, 1 + len(leaf) // _LEAF_UNIT, 0)

    return load


for _op in (
    pickle.STRING,
    pickle.BINSTRING,
    pickle.SHORT_BINSTRING,
    pickle.UNICODE,
    pickle.BINUNICODE,
    pickle.SHORT_BINUNICODE,
    pickle.BINUNICODE8,
    pickle.BINBYTES,
    pickle.SHORT_BINBYTES,
    pickle.BINBYTES8,
    pickle.BYTEARRAY8,
):
    GuardedUnpickler.dispatch[_op[0]] = _sized_leaf(pickle._Unpickler.dispatch[_op[0]])  # type: ignore[attr-defined]
del _op

__all__ = [
    "MAX_LONG_BYTES",
    "MAX_PICKLE_BYTES",
    "MAX_PICKLE_DEPTH",
    "MAX_PICKLE_ELEMENTS",
    "PICKLE_OBJECTS_BASE",
    "PICKLE_OBJECTS_PER_BYTE",
    "GuardedUnpickler",
    "Refused",
    "Unsafe",
    "describe",
    "spend",
]
