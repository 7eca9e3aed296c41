"""A Megatron-LM checkout read as source: its version and the flags its parser defines, without importing it.

Megatron-LM ≥ 0.17 needs Python ≥ 3.12, so a login node (or CI) may hold a checkout it cannot run. Its
`megatron/training/arguments.py` still says what the parser takes: flags added with `add_argument`, and
groups built by `ArgumentGroupFactory(SomeConfig, exclude=[...])` from a dataclass's fields (`--field-name`;
a bool defaulting to True becomes `--no-field-name`/`--disable-field-name`; `argparse_meta` in the field's
metadata overrides names and action). The dataclasses are found by following the imports, into the
checkout's `megatron/core` or, for a checkout without one (≤ 0.16), the installed megatron-core wheel.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import tomllib
from collections.abc import Iterator
from pathlib import Path

from longctx.errors import StageError

ARGUMENTS = Path("megatron/training/arguments.py")
PACKAGE_INFO = Path("megatron/core/package_info.py")
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}
_PLAIN_TYPES = {"int", "float", "str"}


@dataclasses.dataclass(frozen=True)
class FlagInfo:
    """One option string of the parser: whether it takes a value after it, and the value's type when
    the source names a plain one (int, float, str; None: anything else or unknown)."""

    takes_value: bool
    value_type: str | None = None


def _installed_core() -> Path | None:
    """The installed megatron-core wheel's `megatron/core` directory (found from its metadata, not imported)."""
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("megatron/core")))
    return path if path.is_dir() else None


def _package_info_version(path: Path) -> str | None:
    """MAJOR.MINOR.PATCH(+PRE_RELEASE) from a package_info.py, read as constants."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    values[t.id] = node.value.value
    if not all(k in values for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{values.get('PRE_RELEASE') or ''}"


def checkout_version(root: Path) -> tuple[str, str]:
    """(version, where it was read) of a Megatron-LM checkout: its megatron/core/package_info.py, a static
    version in its pyproject.toml, else (a checkout without megatron/core) the installed megatron-core's."""
    own = root / PACKAGE_INFO
    if own.is_file() and (v := _package_info_version(own)):
        return v, str(own)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        static = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("version")
        if isinstance(static, str):
            return static, str(pyproject)
    core = _installed_core()
    if core is not None and (core / "package_info.py").is_file():
        v = _package_info_version(core / "package_info.py")
        if v:
            return v, f"{core / 'package_info.py'} (the installed megatron-core; {root} has no megatron/core)"
    raise StageError(
        f"cannot tell which Megatron-LM {root} is",
        where=str(root),
        fix="point [megatron].path at a Megatron-LM checkout (megatron/core/package_info.py), or install "
        "the megatron-core it runs with",
    )


class _Source:
    """The checkout's modules by dotted name, parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.roots = {"megatron.training": root / "megatron" / "training"}
        core = root / "megatron" / "core"
        installed = _installed_core()
        self.roots["megatron.core"] = core if core.is_dir() else (installed or core)
        self._trees: dict[str, ast.Module | None] = {}

    def path(self, module: str) -> Path | None:
        for prefix, base in self.roots.items():
            if module == prefix or module.startswith(prefix + "."):
                rel = module[len(prefix) :].strip(".").replace(".", "/")
                for cand in (base / rel / "__init__.py", base.joinpath(rel + ".py") if rel else None):
                    if cand is not None and cand.is_file():
                        return cand
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            p = self.path(module)
            self._trees[module] = ast.parse(p.read_text(encoding="utf-8")) if p else None
        return self._trees[module]

    def find_class(
        self, module: str, name: str, seen: frozenset[str] = frozenset()
    ) -> tuple[str, ast.ClassDef] | None:
        """The class `name` as `module` sees it: defined there, or imported (followed to its definition)."""
        tree = self.tree(module)
        if tree is None or (module, name) in seen:
            return None
        seen = seen | {f"{module}:{name}"}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                orig = next(a.name for a in node.names if (a.asname or a.name) == name)
                found = self.find_class(_absolute(module, node, self.path(module)), orig, seen)
                if found:
                    return found
        return None


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    is_pkg = path is not None and path.name == "__init__.py"
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _literal(node: ast.AST | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, SyntaxError, TypeError):
        return None


def _is_bool(annotation: ast.AST) -> bool:
    """`bool`, `Optional[bool]` or `bool | None` (argparse_utils treats all three as switches)."""
    if isinstance(annotation, ast.Name):
        return annotation.id == "bool"
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        return annotation.value.id == "Optional" and _is_bool(annotation.slice)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        other = annotation.right if _is_bool(annotation.left) else annotation.left
        return (_is_bool(annotation.left) or _is_bool(annotation.right)) and (
            isinstance(other, ast.Constant) and other.value is None
        )
    return False


def _field_flags(name: str, node: ast.AnnAssign) -> dict[str, FlagInfo]:
    """The option strings ArgumentGroupFactory makes of one dataclass field ({} for init=False)."""
    default: object = None
    meta: dict[str, object] = {}
    if (
        isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", getattr(node.value.func, "attr", "")) == "field"
    ):
        kw = {k.arg: k.value for k in node.value.keywords if k.arg}
        if _literal(kw.get("init")) is False:
            return {}
        default = _literal(kw.get("default"))
        metadata = kw.get("metadata")
        if isinstance(metadata, ast.Dict):
            for k, v in zip(metadata.keys, metadata.values, strict=True):
                if _literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                    meta = {str(_literal(mk)): mv for mk, mv in zip(v.keys, v.values, strict=True)}
    elif node.value is not None:
        default = _literal(node.value)
    flag = "--" + name.replace("_", "-")
    names, takes_value = [flag], True
    plain = _plain_annotation(node.annotation)
    if _is_bool(node.annotation):
        takes_value = False
        if default is not False:  # store_false: the switch turns the default off
            names = [f"--no-{flag[2:]}", f"--disable-{flag[2:]}"]
    if "arg_names" in meta:
        given = _literal(meta["arg_names"])  # type: ignore[arg-type]
        names = [str(n) for n in given] if isinstance(given, list) else names
    if "action" in meta:
        takes_value = _literal(meta["action"]) not in _NO_VALUE_ACTIONS  # type: ignore[arg-type]
    if "type" in meta:
        given_type = meta["type"]
        plain = given_type.id if isinstance(given_type, ast.Name) and given_type.id in _PLAIN_TYPES else None
    return {n: FlagInfo(takes_value, plain if takes_value else None) for n in names}


def _plain_annotation(annotation: ast.AST) -> str | None:
    """int/float/str, also inside Optional[...] or `... | None`."""
    if isinstance(annotation, ast.Name):
        return annotation.id if annotation.id in _PLAIN_TYPES else None
    if isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", "") == "Optional":
        return _plain_annotation(annotation.slice)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [
            a
            for a in (annotation.left, annotation.right)
            if not (isinstance(a, ast.Constant) and a.value is None)
        ]
        return _plain_annotation(sides[0]) if len(sides) == 1 else None
    return None


def _class_fields(src: _Source, module: str, cls: ast.ClassDef) -> Iterator[tuple[str, ast.AnnAssign]]:
    """A dataclass's annotated fields, its bases' first (as dataclasses.fields orders them)."""
    for base in cls.bases:
        if isinstance(base, ast.Name) and (found := src.find_class(module, base.id)):
            yield from _class_fields(src, *found)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann = ast.unparse(node.annotation)
            if not ann.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                yield node.target.id, node


def _add_argument_flags(call: ast.Call) -> dict[str, FlagInfo]:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
    action = next((k.value for k in call.keywords if k.arg == "action"), None)
    if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
        # argparse adds the --no- twin itself
        return {f: FlagInfo(False) for n in names for f in (str(n), "--no-" + str(n)[2:])}
    takes = not (isinstance(action, ast.Constant) and action.value in _NO_VALUE_ACTIONS)
    kind = next((k.value for k in call.keywords if k.arg == "type"), None)
    plain = kind.id if isinstance(kind, ast.Name) and kind.id in _PLAIN_TYPES else None
    return {str(n): FlagInfo(takes, plain if takes else None) for n in names}


def _local_lists(fn: ast.AST) -> dict[str, list[str]]:
    """Names bound to list literals of strings inside a function (an `exclude = [...]`)."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(value := _literal(node.value), list):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = [str(v) for v in value]
    return out


def _factory_flags(src: _Source, call: ast.Call, lists: dict[str, list[str]]) -> dict[str, FlagInfo]:
    if not call.args or not isinstance(call.args[0], ast.Name):
        return {}
    found = src.find_class("megatron.training.arguments", call.args[0].id)
    if found is None:
        raise StageError(
            f"cannot find the dataclass {call.args[0].id} that arguments.py builds flags from",
            where=str(src.roots["megatron.training"] / "arguments.py"),
            fix="point at a complete Megatron-LM checkout (and, for ≤ 0.16, install its megatron-core)",
        )
    exclude_node = next((k.value for k in call.keywords if k.arg == "exclude"), None)
    exclude = (
        lists.get(exclude_node.id, []) if isinstance(exclude_node, ast.Name) else _literal(exclude_node) or []
    )
    out: dict[str, FlagInfo] = {}
    for name, node in _class_fields(src, *found):
        if name not in exclude:  # type: ignore[operator]
            out.update(_field_flags(name, node))
    return out


def parser_flags(root: Path) -> dict[str, FlagInfo]:
    """Every option string Megatron-LM's `parse_args` defines in the checkout at `root`, read from source."""
    path = root / ARGUMENTS
    if not path.is_file():
        raise StageError(
            f"no {ARGUMENTS} under {root}",
            where=str(root),
            fix="point at a Megatron-LM checkout (the directory with pretrain_gpt.py)",
        )
    src = _Source(root)
    tree = src.tree("megatron.training.arguments")
    assert tree is not None  # the file exists (checked above)
    flags: dict[str, FlagInfo] = {"-h": FlagInfo(False), "--help": FlagInfo(False)}  # argparse's own
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        lists = _local_lists(fn)
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if callee == "add_argument":
                flags.update(_add_argument_flags(call))
            elif callee == "ArgumentGroupFactory":
                flags.update(_factory_flags(src, call, lists))
    return flags


__all__ = ["FlagInfo", "checkout_version", "parser_flags"]
