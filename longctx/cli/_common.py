"""Shared CLI plumbing: error rendering, JSON output, findings tables.

Command modules import the library inside their functions so that `longctx --help` and light commands
start fast (the library pulls in pydantic, numpy and, for some commands, torch and megatron-core).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from longctx.errors import Interrupted, LongctxError
from longctx.launch.stop import stop_on_signals
from longctx.report import Findings, to_jsonable
from longctx.util.oserrors import file_system_error
from longctx.util.printable import printable

if TYPE_CHECKING:
    from longctx.plan.derive import ResolvedPlan

# Logs and pipes get a wide console so tables stay readable; terminals keep their own width.
console = Console(width=None if sys.stdout.isatty() else 180)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 2


def fail(err: LongctxError, *, as_json: bool = False) -> NoReturn:
    """Print an error (what / where / fix) and exit 2 — a command stopped by a signal (`Interrupted`)
    exits 128 + the signal's number instead. What it quotes from files (a lock's host, a log line) is
    printed with its control characters escaped."""
    if as_json:
        _error_document(err.to_json())
    stopped = isinstance(err, Interrupted)
    head = "[bold yellow]" if stopped else "[bold red]error:[/] "  # Interrupted's what says "stopped by …"
    err_console.print(
        f"{head}{escape(printable(err.what))}{'[/]' if stopped else ''}", highlight=False, soft_wrap=True
    )
    if err.where:
        err_console.print(f"  [red]where:[/] {escape(printable(err.where))}", highlight=False, soft_wrap=True)
    if err.fix:
        err_console.print(f"  [red]fix:[/] {escape(printable(err.fix))}", highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code if isinstance(err, Interrupted) else EXIT_ERROR)


def cli_errors(fn: F) -> F:
    """Decorate a command so any LongctxError, and any OS error nothing closer turned into one (a
    read-only or full file system, a permission), becomes a clean message and exit code 2. The command
    runs under the one signal discipline (`longctx.launch.stop`): SIGTERM, SIGINT or SIGUSR1 stops it and
    what it started, with a message and exit 128 + the signal (`Interrupted`), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("json_out") or kwargs.get("as_json"))
        try:
            with stop_on_signals(raise_when_idle=True):
                return fn(*args, **kwargs)
        except LongctxError as err:
            fail(err, as_json=as_json)
        except OSError as err:
            fail(file_system_error(err, _command_name()), as_json=as_json)
        except KeyboardInterrupt as err:  # code that turns a signal into one to clean up (tokenize)
            fail(Interrupted(_signal_of(err)), as_json=as_json)

    return wrapper  # type: ignore[return-value]


def _signal_of(err: KeyboardInterrupt) -> int:
    """The signal behind a KeyboardInterrupt: the one it names ("signal 15"), else SIGINT."""
    said = str(err).removeprefix("signal ")
    return int(said) if said.isdigit() else int(signal.SIGINT)


def _command_name() -> str:
    """The running command as typed (`longctx stage run`)."""
    ctx = _current_context(silent=True)
    return ctx.command_path if ctx is not None else "longctx"


_JSON_ASKED = "longctx.json"


def _click_module(name: str) -> Any:
    """A module of the click the installed typer runs on (newer typers carry their own copy of click)."""
    core = next(
        c for c in typer.Context.__mro__ if c.__name__ == "Context" and c.__module__.endswith(".core")
    )
    return importlib.import_module(f"{core.__module__.rsplit('.', 1)[0]}.{name}")


UsageError: type[Exception] = _click_module("exceptions").UsageError
_current_context = _click_module("globals").get_current_context


class JsonUsageGroup(TyperGroup):
    """The root command: a usage error (unknown option, bad value, missing argument) of a command run
    with --json also prints its one JSON document on stdout, the error object naming what/where/fix;
    click's own message still goes to stderr and the exit code stays 2."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        asked = "--json" in args
        try:
            ctx = super().make_context(info_name, list(args), parent=parent, **extra)
        except UsageError as err:
            if asked:
                _usage_json(err)
            raise
        ctx.meta[_JSON_ASKED] = asked
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            if ctx.meta.get(_JSON_ASKED):
                _usage_json(err)
            raise


def _usage_json(err: Exception) -> None:
    ctx = getattr(err, "ctx", None)
    path = ctx.command_path if ctx is not None else "longctx"
    what = err.format_message() if hasattr(err, "format_message") else str(err)
    _error_document(
        {
            "type": "UsageError",
            "what": what,
            "where": path,
            "fix": f"see `{path} --help` for the arguments and options it takes",
        }
    )


def _error_document(error: dict[str, Any]) -> None:
    """The one JSON document a failing command prints under --json."""
    print(json.dumps({"ok": False, "error": error}, indent=2), flush=True)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """While active, what would go to stdout (progress lines, child processes' output) goes to stderr,
    so that `--json` leaves exactly one JSON document on stdout."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved_fd = _dup_stdout_fd()
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stdout = saved
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _dup_stdout_fd() -> int | None:
    """Point fd 1 (inherited by child processes) at stderr; the saved fd, or None without real fds."""
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        return None
    return saved


def resolved_plan(plan: Path, run_dir: Path | None = None) -> ResolvedPlan:
    """The plan a command names (a file or a shipped plan's name), loaded and resolved once: the one way the
    CLI opens a plan (a real plan pointed at a rehearsal's run directory is refused there)."""
    from longctx.plan.derive import open_plan

    return open_plan(plan, run_dir)


def fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, one level deep (nested values stay as they are)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def findings_table(findings: Findings, title: str | None = None) -> Table:
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("level")
    table.add_column("check")
    table.add_column("message", overflow="fold")
    colors = {"error": "bold red", "warning": "yellow", "info": "dim"}
    for f in findings:
        msg = f.message
        if f.expected is not None or f.found is not None:
            msg += f" (expected {f.expected!s}, found {f.found!s})"
        if f.fix and f.level != "info":
            msg += f" — fix: {f.fix}"
        table.add_row(f"[{colors[f.level]}]{f.level}[/]", escape(f.code), escape(msg))
    return table


def print_findings(findings: Findings, title: str | None = None) -> None:
    if findings:
        console.print(findings_table(findings, title))
    # one plain line per error too, so logs and greps see them without the table
    for f in findings.errors:
        line = f"error: {f.code}: {f.message}"
        if f.expected is not None or f.found is not None:
            line += f" (expected {f.expected!s}, found {f.found!s})"
        if f.where:
            line += f" [{f.where}]"
        err_console.print(line, style="red", markup=False, highlight=False, soft_wrap=True)


def exit_for(findings: Findings) -> None:
    if not findings.ok:
        raise typer.Exit(EXIT_ERROR)


def parse_int_list(text: str | None) -> list[int] | None:
    """'16384,65536' or '16K,64K,128K' → [16384, 65536, 131072]."""
    if text is None or text.strip() == "":
        return None
    out: list[int] = []
    for raw in text.replace(" ", "").split(","):
        if not raw:
            continue
        out.append(parse_size(raw))
    return out


def positive_size(text: str | None, option: str) -> int | None:
    """`parse_size` for one option, its name in the message; None stays None, 0 and below are refused."""
    if text is None:
        return None
    try:
        value = parse_size(text)
    except typer.BadParameter as err:
        raise typer.BadParameter(f"{option}: {err.message}") from None
    if value <= 0:
        raise typer.BadParameter(f"{option}: must be positive, got {text!r}")
    return value


def positive_sizes(text: str | None, option: str) -> list[int] | None:
    """`parse_int_list` for one option, its name in the message; every length must be positive."""
    try:
        values = parse_int_list(text)
    except typer.BadParameter as err:
        raise typer.BadParameter(f"{option}: {err.message}") from None
    for v in values or []:
        if v <= 0:
            raise typer.BadParameter(f"{option}: lengths must be positive, got {v}")
    return values


def parse_size(raw: str) -> int:
    """Integer with an optional K/M/G suffix (binary for K: 16K = 16384; M and G decimal for tokens)."""
    s = raw.strip()
    mult = 1
    suffix = s[-1:].upper()
    if suffix == "K":
        mult, s = 1024, s[:-1]
    elif suffix == "M":
        mult, s = 1_000_000, s[:-1]
    elif suffix == "G" or suffix == "B":
        mult, s = 1_000_000_000, s[:-1]
    try:
        value = float(s)
    except ValueError:
        raise typer.BadParameter(f"not a number: {raw!r}") from None
    result = value * mult
    if result != int(result):
        raise typer.BadParameter(f"not an integer: {raw!r}")
    return int(result)
