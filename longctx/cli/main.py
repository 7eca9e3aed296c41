"""Entry point: `longctx NOUN VERB …`. Sub-apps live in one module per noun."""

from __future__ import annotations

import importlib
from types import ModuleType

import typer

from longctx import __version__
from longctx.cli._common import EXIT_ERROR, JsonUsageGroup, err_console
from longctx.util.quiet import quiet_megatron_notices

quiet_megatron_notices()

app = typer.Typer(
    name="longctx",
    cls=JsonUsageGroup,
    help=(
        "Turn a Megatron-LM base model into a long-context model by staged continued pretraining "
        "(4K → 16K → 64K → 128K): verify tokenizer, data and checkpoint; plan stages; launch resumable "
        "Megatron-LM or local jobs; chain them on Slurm; evaluate each stage.\n\n"
        "Start with `longctx demo` (CPU, ~10 min) or `longctx plan show stages/baby_9b_dense.toml`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# (module, name) — order is the order in `longctx --help`.
SUBAPPS: list[tuple[str, str]] = [
    ("tokenizer", "tokenizer"),
    ("data", "data"),
    ("ckpt", "ckpt"),
    ("rope", "rope"),
    ("plan", "plan"),
    ("stage", "stage"),
    ("slurm", "slurm"),
    ("eval", "eval"),
    ("export", "export"),
    ("bench", "bench"),
]


def _register() -> None:
    for module_name, name in SUBAPPS:
        sub = _load(module_name).app
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=name)
        else:  # a single command module exposes a plain function
            app.command(name=name)(sub)
    demo = _load("demo")
    app.command(name="demo", help=demo.HELP)(demo.demo)
    rehearse = _load("rehearse")
    app.command(name="rehearse", help=rehearse.HELP)(rehearse.rehearse)


def _load(module_name: str) -> ModuleType:
    """A sub-app's module; one that fails to import stops the CLI with the module and the exception (exit 2):
    a missing sub-app is a broken installation, not a command to leave out. Sub-apps import only typer,
    rich and the light parts of longctx at module level (optional extras inside their commands), so
    `longctx --help` works without the extras."""
    full = f"longctx.cli.{module_name}"
    try:
        return importlib.import_module(full)
    except Exception as err:  # any import failure is reported the same way
        err_console.print(
            f"error: the `longctx {module_name}` commands cannot be loaded: {type(err).__name__}: {err}\n"
            f"  where: {full}\n"
            "  fix: reinstall longctx (pip install -e .) or repair the module the error names",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise SystemExit(EXIT_ERROR) from err


def _version(value: bool) -> None:
    if value:
        typer.echo(f"longctx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    pass


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
