"""House rules a reader relies on, checked on the whole tree: the formatter decides the shape (a `# fmt: skip`
only on a data table), every CLI parameter carries its type, the CLI modules share only public names, lines
fit a screen, and a test module is never a library for another (shared helpers live in tests/fixtures/).
Each rule's checker is also run on a planted violation, so a checker that finds nothing cannot pass."""

from __future__ import annotations

import ast
import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "longctx"
CLI = PACKAGE / "cli"
MAX_LINE = 120
# the one definition of a data table and of a misplaced marker: scripts/house-figures counts them with it
_LOADER = SourceFileLoader("house_figures", str(REPO / "scripts" / "house-figures"))
_FIGURES = importlib.util.module_from_spec(importlib.util.spec_from_loader("house_figures", _LOADER))
_LOADER.exec_module(_FIGURES)
misplaced_fmt_skips = _FIGURES.misplaced_fmt_skips


def _python_files() -> list[Path]:
    files = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def unannotated_cli_parameters(source: str) -> list[str]:
    """`function.parameter` for each parameter of a CLI function (command or helper) without a type annotation."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            out += [
                f"{node.name}.{a.arg}" for a in args if a.annotation is None and a.arg not in {"self", "cls"}
            ]
    return out


def private_cli_imports(source: str, module: str) -> list[str]:
    """Private names (`_x`) that CLI module `module` imports from another CLI module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("longctx.cli."):
            if node.module == f"longctx.cli.{module}":
                continue
            out += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return out


def imports_of_test_modules(source: str) -> list[str]:
    """Modules named `test_*` that a test file imports: shared helpers belong in tests/fixtures/."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return sorted({n for n in names if any(part.startswith("test_") for part in n.split("."))})


def long_lines(source: str) -> list[int]:
    return [i for i, line in enumerate(source.splitlines(), 1) if len(line) > MAX_LINE]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_fmt_skip_only_on_data_tables() -> None:
    found = [f"{_rel(p)}:{n}" for p in _python_files() for n in misplaced_fmt_skips(p.read_text())]
    assert not found, "`# fmt: skip` outside a data table (let ruff format lay it out):\n" + "\n".join(found)


def test_every_cli_parameter_is_annotated() -> None:
    found = [
        f"{_rel(p)}: {n}" for p in sorted(CLI.glob("*.py")) for n in unannotated_cli_parameters(p.read_text())
    ]
    assert not found, "CLI parameters without a type annotation:\n" + "\n".join(found)


def test_no_cli_module_imports_another_ones_private_names() -> None:
    found = [
        f"{_rel(p)}: {n}"
        for p in sorted(CLI.glob("*.py"))
        for n in private_cli_imports(p.read_text(), p.stem)
    ]
    assert not found, (
        "private names imported across CLI modules (make them public in the library):\n" + "\n".join(found)
    )


def test_no_test_imports_a_test_module() -> None:
    tests = sorted(p for p in (REPO / "tests").rglob("*.py") if "__pycache__" not in p.parts)
    found = [f"{_rel(p)}: {n}" for p in tests for n in imports_of_test_modules(p.read_text())]
    assert not found, "test files importing test modules (move the helper to tests/fixtures/):\n" + "\n".join(
        found
    )


def test_no_line_over_the_limit() -> None:
    found = [f"{_rel(p)}:{n}" for p in _python_files() for n in long_lines(p.read_text())]
    assert not found, f"lines over {MAX_LINE} characters:\n" + "\n".join(found)


TABLE = "ROWS = [\n    (1, 2),\n    (3, 4),\n    (5, 6),\n]  # fmt: skip\n"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        (TABLE, []),
        ("x = f(1,  2)  # fmt: skip\n", [1]),
        ("PAIR = [1, 2]  # fmt: skip\n", [1]),
        ("def f():\n    return {'a': 1, 'b': 2, 'c': 3}  # fmt: skip\n", [2]),
        ("ENV = {'A': job.a, 'B': 1, 'C': 2}  # fmt: skip\n", [1]),
        ("CMD = [f'--x={x}', '--y', '1']  # fmt: skip\n", [1]),
        ("NEG = [(-1, 'a'), (2, 'b'), (3, None)]  # fmt: skip\n", []),
        ("GROUPS = [(_DATA, ('--a',)), (_MODEL, ('--b',)), ('x', ())]  # fmt: skip\n", []),
        ("ROWS = [(a, 1), (b, 2), (c, 3)]  # fmt: skip\n", [1]),
        ("x = 1  # a comment about fmt: skip, not a directive... still a marker  # fmt: skip\n", [1]),
        ("s = '# fmt: skip'\n", []),
    ],
)
def test_a_planted_fmt_skip_outside_a_table_is_found(source: str, found: list[int]) -> None:
    assert misplaced_fmt_skips(source) == found


def test_a_planted_unannotated_cli_parameter_is_found() -> None:
    source = (
        "@app.command('x')\n"
        "def x_cmd(plan: Path, run_dir=typer.Option(None), *, quiet: bool = False) -> None: ...\n"
        "def helper(a, b): ...\n"
    )
    assert unannotated_cli_parameters(source) == ["x_cmd.run_dir", "helper.a", "helper.b"]


def test_a_planted_private_cross_import_between_cli_modules_is_found() -> None:
    source = "from longctx.cli.stage import _open, run_cmd\nfrom longctx.cli.rope import _own\n"
    assert private_cli_imports(source, "rope") == ["longctx.cli.stage._open"]


def test_a_planted_import_of_a_test_module_is_found() -> None:
    source = "from tests.plan.test_bad_plans import dump_toml\nfrom tests.fixtures.run import tiny\n"
    assert imports_of_test_modules(source) == [
        "tests.plan.test_bad_plans",
        "tests.plan.test_bad_plans.dump_toml",
    ]
    assert imports_of_test_modules("from .test_cli import helper\n") == ["test_cli", "test_cli.helper"]


def test_a_planted_long_line_is_found() -> None:
    assert long_lines("x = 1\n" + "y = '" + "a" * MAX_LINE + "'\n") == [2]
