"""Entry point: `longctx NOUN VERB …`. Sub-apps live in one module per noun."""

from __future__ import annotations

import importlib

import typer

from longctx import __version__
from longctx.cli._common import JsonUsageGroup
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
        module = _load(module_name)
        if module is None:
            continue
        sub = module.app
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=name)
        else:  # a single command module exposes a plain function
            app.command(name=name)(sub)
    demo = _load("demo")
    if demo is not None:
        app.command(name="demo", help=demo.HELP)(demo.demo)


def _load(module_name: str):
    full = f"longctx.cli.{module_name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as err:
        if err.name == full:  # a sub-app that is not part of this build
            return None
        raise


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
