"""The parameters every command spells the same way: the plan, `--run-dir`, `--json`, `--force`.

A command whose subject is a plan takes it as its first positional argument (`longctx stage run PLAN`);
commands whose subject is something else take `--plan PLAN` (`eval run CKPT --plan PLAN`, `demo --plan`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PLAN_HELP = "plan file (stages/*.toml), or a shipped plan by name (`longctx plan list`)"
JSON_HELP = "Print exactly one JSON document (also on failure)."

Plan = Annotated[Path, typer.Argument(help=PLAN_HELP, show_default=False)]
RunDir = Annotated[
    Path | None, typer.Option("--run-dir", help="override the plan's run_dir (also $LONGCTX_RUN_DIR)")
]
Json = Annotated[bool, typer.Option("--json", help=JSON_HELP)]


def force(help: str) -> object:
    """`--force` with what it overrides in this command (what is forced differs, the flag does not)."""
    return Annotated[bool, typer.Option("--force", help=help)]
