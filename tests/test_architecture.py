"""The import graph of `longctx/` obeys the layering docs/architecture.md describes: each
folder imports only the folders below it, and no two modules import each other (directly or round
a cycle). Imports inside functions count too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "longctx"

# The shared vocabulary every folder may use: errors, findings, the architecture type, small utilities,
# and the table of what each Megatron-LM release adds, removes or redefines (argv, tokenizer, RoPE and
# checkpoint readers all consult it).
FOUNDATION = {"errors", "report", "arch", "objective", "util", "megatron_versions", "__init__"}

# folder → the folders it may import (besides itself and FOUNDATION). Lower layers first.
ALLOWED: dict[str, set[str]] = {
    "util": set(),
    "tokenizer": set(),
    "rope": set(),
    "attention": set(),
    "diffusion": set(),
    "launch": set(),
    "data": {"tokenizer"},
    "checkpoint": {"tokenizer"},
    "mcore": {"attention", "checkpoint"},
    "plan": {"tokenizer", "rope", "data", "checkpoint"},
    "train": {"attention", "diffusion", "checkpoint", "mcore"},
    "eval": {"tokenizer", "attention", "diffusion", "data", "checkpoint", "mcore", "plan"},
    "stage": {"tokenizer", "rope", "data", "checkpoint", "plan", "launch", "train", "eval"},
    "slurm": {"tokenizer", "rope", "data", "checkpoint", "plan", "launch", "stage"},
    # entry points: bench launches worker processes (the device run), the demo picks the devices it trains on
    "bench": {
        "tokenizer",
        "rope",
        "attention",
        "diffusion",
        "data",
        "checkpoint",
        "mcore",
        "plan",
        "train",
        "launch",
    },
    "demo": {"tokenizer", "data", "checkpoint", "mcore", "plan", "launch", "train", "eval", "stage"},
    # the rehearsal: a plan's whole chain on a micro model (stages, evaluation, export and its parity)
    "rehearse": {
        "tokenizer",
        "data",
        "checkpoint",
        "mcore",
        "plan",
        "launch",
        "train",
        "eval",
        "stage",
        "export",
        "slurm",  # the preflight a chain's submit runs, before the rehearsal's chain on megatron-lm
    },
    "export": {"tokenizer", "rope", "checkpoint", "plan"},
    "cli": {"*"},
    "__main__": {"*"},  # `python -m longctx`: the CLI
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Every longctx module `module` imports, anywhere in the file."""
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            if n.startswith("longctx"):
                r = _resolve(n)
                if r and r != module:
                    found.add(r)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    head = parts[1]
    return head if (ROOT / head).is_dir() else head.removesuffix(".py")


def test_every_folder_has_a_rule() -> None:
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    folders.discard("resources")
    assert folders <= set(ALLOWED), f"folders without an import rule: {sorted(folders - set(ALLOWED))}"


def test_no_forbidden_arrow() -> None:
    bad: list[str] = []
    for m, targets in GRAPH.items():
        src = _folder(m)
        allowed = ALLOWED.get(src, set())
        if "*" in allowed:
            continue
        for t in targets:
            dst = _folder(t)
            if dst == src or dst in FOUNDATION or dst in allowed:
                continue
            bad.append(f"{m} → {t} ({src} must not import {dst})")
    assert not bad, "forbidden imports:\n" + "\n".join(sorted(bad))


def test_foundation_imports_only_foundation() -> None:
    bad = [
        f"{m} → {t}"
        for m, ts in GRAPH.items()
        if _folder(m) in FOUNDATION - {"__init__"}
        for t in ts
        if _folder(t) not in FOUNDATION
    ]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def test_no_module_cycle() -> None:
    # a package __init__ importing its own children is a re-export, not a cycle
    g = {
        m: {t for t in ts if not (t.startswith(m + ".") or m.startswith(t + "."))} for m, ts in GRAPH.items()
    }
    assert not _cycles(g)


def test_no_folder_cycle() -> None:
    fg: dict[str, set[str]] = defaultdict(set)
    for m, ts in GRAPH.items():
        for t in ts:
            if _folder(m) != _folder(t) and _folder(t) not in FOUNDATION:
                fg[_folder(m)].add(_folder(t))
    assert not _cycles(dict(fg))


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [("eval", "demo", False), ("data", "plan", False), ("stage", "slurm", False), ("plan", "data", True)],
)
def test_rules_say_what_the_readme_says(src: str, dst: str, ok: bool) -> None:
    assert (dst in ALLOWED[src]) is ok


# -- a plan is resolved once, in longctx/plan ----------------------------------------------------------------
# Everything downstream receives the values of a ResolvedPlan (docs/architecture.md, "Data flows one way"):
# only longctx/plan resolves a plan's path strings, and nothing else reads the raw plan behind a ResolvedPlan.

PATHS_MODULE = "longctx.plan.paths"


def _outside_plan(module: str) -> bool:
    return not (module == "longctx.plan" or module.startswith("longctx.plan."))


def test_only_plan_resolves_paths() -> None:
    bad = sorted(m for m, ts in GRAPH.items() if _outside_plan(m) and PATHS_MODULE in ts)
    assert not bad, (
        f"{PATHS_MODULE} imported outside longctx/plan (take the resolved path from ResolvedPlan / "
        "ResolvedStage instead):\n" + "\n".join(bad)
    )


def _plan_fields() -> set[str]:
    from longctx.plan.schema import Plan

    return set(Plan.model_fields) | {"plan_path", "stage"}


def _resolved_names(tree: ast.AST) -> set[str]:
    """`rp`, `resolved`, and every parameter annotated as a ResolvedPlan."""
    names = {"rp", "resolved"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation and "ResolvedPlan" in ast.unparse(node.annotation):
            names.add(node.arg)
    return names


def raw_plan_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each read of the raw plan: `rp.plan`, `x.rp.plan`, `resolved.plan` (or any
    name annotated ResolvedPlan), and `….plan.<a Plan field>` (`lp.rp.plan.tokenizer`, `self.plan.base`)."""
    tree = ast.parse(source)
    names, fields = _resolved_names(tree), _plan_fields()
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr == "plan":
            v = node.value
            if (isinstance(v, ast.Name) and v.id in names) or (
                isinstance(v, ast.Attribute) and v.attr in names
            ):
                found.setdefault(node.lineno, ast.unparse(node))
        elif node.attr in fields and isinstance(node.value, ast.Attribute) and node.value.attr == "plan":
            found.setdefault(node.lineno, ast.unparse(node))
    return sorted(found.items())


def test_nothing_downstream_reads_the_raw_plan() -> None:
    bad = [
        f"{path.relative_to(ROOT.parent)}:{line}: {expr}"
        for m, path in sorted(MODULES.items())
        if _outside_plan(m)
        for line, expr in raw_plan_reads(path.read_text())
    ]
    assert not bad, (
        "the raw plan read outside longctx/plan (ResolvedPlan carries the value: rp.name, rp.run_dir, "
        "rp.tokenizer, rp.base, rp.megatron, rp.cluster, rp.local, …):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("line", "read"),
    [
        ("x = rp.plan.tokenizer.path", True),
        ("x = resolved.plan", True),
        ("x = self.rp.plan", True),
        ("def f(r: ResolvedPlan):\n    return r.plan", True),
        ("x = inp.plan.base", True),
        ("x = rp.run_dir", False),
        ("x = inp.plan.tensors", False),  # an export plan, not the raw plan
        ("x = cfg.plan", False),
    ],
)
def test_raw_plan_reads_are_recognised(line: str, read: bool) -> None:
    assert bool(raw_plan_reads(line)) is read


MAX_FUNCTION_LINES = 80


def test_no_function_over_80_lines() -> None:
    """Every function of longctx/, the CLI included, reads on one screen: a longer one holds more than one
    step (the CLI: parse, call one library function, render)."""
    long = [
        f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(sorted(long))
