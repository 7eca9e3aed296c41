"""`longctx.launch.stop`, the one signal discipline, with workers that do not cooperate: a first signal
is passed on once, a second kills the whole tree (grandchildren too); a child started after a stop was
asked gets the signal at once; a command with nothing running stops on the spot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from longctx.errors import Interrupted
from longctx.launch import stop
from longctx.util.orphan import PARENT_ENV
from tests.fixtures.stopping import Command

# a command launching two workers that take SIGTERM as a request they never act on, each with a child
DRIVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from longctx.errors import Interrupted
    from longctx.launch.local import LocalLauncher
    from longctx.launch.stop import raise_if_requested, stop_on_signals

    WORKER = '''
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, lambda *_: print("asked to stop", flush=True))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("worker", os.environ["RANK"], "up", flush=True)
    time.sleep(300)
    '''
    try:
        with stop_on_signals(raise_when_idle=True):
            LocalLauncher(echo=True).run([sys.executable, "-c", WORKER], nproc=2, env={}, log=Path(sys.argv[1]))
            raise_if_requested("the launch")
    except Interrupted as err:
        print(err.what, flush=True)
        sys.exit(err.exit_code)
""")


@pytest.mark.timeout(120)
def test_the_first_signal_is_passed_on_once_and_the_second_kills_the_tree(
    long_command: Callable[..., Command], tmp_path: Path
) -> None:
    log = tmp_path / "launch.log"
    said = lambda: log.read_text() if log.exists() else ""  # noqa: E731
    cmd = long_command([sys.executable, "-c", DRIVER, str(log)], "driver")
    cmd.wait_for(lambda: said().count(" up") == 2, "both workers")
    cmd.wait_for(lambda: len(cmd.snapshot()) == 4, "the workers' children")
    cmd.send(signal.SIGTERM)
    cmd.wait_for(lambda: said().count("asked to stop") == 2, "the signal passed on to each worker")
    assert cmd.proc.poll() is None and len(cmd.snapshot()) == 4, "the first signal must not kill anything"
    cmd.send(signal.SIGTERM)
    assert cmd.ended_within(10) == 143
    assert "stopped by SIGTERM: the launch" in cmd.output
    assert said().count("asked to stop") == 2, "the signal reached a worker more than once"
    assert cmd.left_behind(grace=2) == []


def test_a_command_with_nothing_running_stops_at_once() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as err, stop.stop_on_signals(raise_when_idle=True):
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the signal did not stop the command")
    assert err.value.exit_code == 143 and err.value.what == "stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before, "the scope must give the handler back"


def test_a_child_started_after_the_signal_gets_it_and_a_launcher_scope_only_records() -> None:
    with stop.stop_on_signals():  # a launcher's scope: recorded, not raised
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested() == signal.SIGTERM
        proc = stop.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
        assert stop.wait(proc) == -signal.SIGTERM
        with pytest.raises(Interrupted, match="stopped by SIGTERM: the next step"):
            stop.raise_if_requested("the next step")
    # the command is over: its signal stays in the record, but asks nothing of what runs next
    assert stop.requested() is None and stop.signals_received()[-1] == signal.SIGTERM
    with stop.stop_on_signals():
        assert stop.requested() is None


@pytest.mark.parametrize("forward", [True, False])
def test_only_a_child_this_process_starts_itself_is_told_its_parent(
    forward: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun (forward=False) hands its environment to tasks that slurmstepd starts: told this process is
    their parent, they would take it for dead and stop at once."""
    monkeypatch.setenv(PARENT_ENV, "1")  # inherited from whoever started this process
    show = f"import os; print(os.environ.get({PARENT_ENV!r}))"
    with stop.stop_on_signals():
        proc = stop.spawn([sys.executable, "-c", show], forward=forward, stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=60)
        stop.forget(proc)
    assert out.decode().strip() == (str(os.getpid()) if forward else "None")
