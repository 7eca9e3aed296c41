"""Files of a run read as a careless or hostile user leaves them, and outputs aimed at inputs.

Every file longctx reads from a run (ledger, lock, launch logs, metrics.jsonl, event files) and the demo's
card go through one reader: a regular file inside its root, bounded in size, with bounded numbers. A FIFO
never blocks (each such test runs under a timeout), a 6 GiB sparse file is refused by its size, a record
with an unbounded number or the wrong type is named by line. `stage curves --out` never writes onto the
run's files, an input, the package or a tracked file. What a file says is printed with its control
characters escaped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import longctx
from longctx.cli.main import app
from longctx.demo.published import CARD, read_card
from longctx.errors import CheckpointError
from longctx.stage.ledger import ledger_path
from longctx.stage.lock import lock_path
from longctx.util.printable import one_line, printable
from tests.bad_input.harness import refused, tree_state
from tests.fixtures.run import write_plan

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
TB = "events.out.tfevents.1700000000.host.1.0"


def _metrics(*lines: object) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def _good(it: int, tps: float = 1000.0) -> dict:
    return {"stage": "s1", "iteration": it, "loss": 9.0 - it * 0.1, "lr": 1e-3, "tokens_per_s": tps}


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run)


def _s1(run: Path) -> Path:
    d = run / "stages" / "s1"
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- the output guard: `stage curves --out` --------------------------------------------------------------


def _target(case: str, run: Path, plan: Path, tmp_path: Path) -> tuple[Path, str]:
    """(the --out path, the reason the refusal names) for each thing curves must never overwrite."""
    if case == "ledger":
        ledger_path(run).write_text('{"event": "launch", "stage": "s1"}\n')
        return ledger_path(run), "does not end in .png"
    if case == "plan":
        return plan, "does not end in .png"
    if case == "tracker":
        return run / "base" / "checkpoints" / "latest_checkpointed_iteration.txt", "does not end in .png"
    if case == "event-file":
        tb = _s1(run) / "tensorboard"
        tb.mkdir()
        (tb / TB).write_bytes(b"\0" * 64)
        return tb / TB, "does not end in .png"
    if case == "png-in-a-checkpoint":  # a PNG name inside the base checkpoint (an input)
        return run / "base" / "checkpoints" / "figure.png", "would land on the input"
    if case == "png-in-a-run-subdirectory":
        return _s1(run) / "figure.png", "subdirectory of the run"
    if case == "existing-png-of-the-run":
        eval_dir = run / "eval"
        eval_dir.mkdir()
        (eval_dir / "niah.png").write_bytes(PNG + b"eval's figure")
        return eval_dir / "niah.png", "subdirectory of the run"
    if case == "package":
        return Path(longctx.__file__).parent / "resources" / "curves.png", "installed longctx package"
    if case == "tracked-by-git":
        checkout = tmp_path / "checkout"
        checkout.mkdir()
        (checkout / "figure.png").write_bytes(PNG + b"tracked")
        subprocess.run(["git", "init", "-q", str(checkout)], check=True)
        subprocess.run(["git", "-C", str(checkout), "add", "figure.png"], check=True)
        return checkout / "figure.png", "git tracks"
    if case == "unrelated-file":
        other = tmp_path / "notes.png"
        other.write_text("my notes, not a figure")
        return other, "exists and is not a PNG"
    if case == "symlink":
        (tmp_path / "elsewhere.png").write_bytes(PNG)
        (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
        return tmp_path / "link.png", "symbolic link"
    if case == "fifo":
        os.mkfifo(tmp_path / "pipe.png")
        return tmp_path / "pipe.png", "not a regular file"
    raise AssertionError(case)


OUT_CASES = [
    "ledger", "plan", "tracker", "event-file", "png-in-a-checkpoint", "png-in-a-run-subdirectory",
    "existing-png-of-the-run", "package", "tracked-by-git", "unrelated-file", "symlink", "fifo",
]  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", OUT_CASES)
def test_curves_out_never_lands_on_a_file_it_must_not_write(
    case: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    (_s1(fresh_run) / "metrics.jsonl").write_bytes(_metrics(_good(1), _good(2)))  # curves are readable
    out, needle = _target(case, fresh_run, plan, tmp_path)
    watch = [fresh_run, tmp_path] + ([out.parent] if case == "package" else [])
    msg = refused(["stage", "curves", plan, "--out", out], watch, needle=needle)
    assert "nothing was written" in msg and not (case == "package" and out.exists())


def test_curves_out_replaces_its_earlier_figure_and_an_other_file_only_with_force(
    fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    (_s1(fresh_run) / "metrics.jsonl").write_bytes(_metrics(_good(1), _good(2), _good(3)))
    earlier = tmp_path / "curves.png"
    earlier.write_bytes(PNG + b"an earlier figure")
    r = runner.invoke(app, ["stage", "curves", str(plan), "--out", str(earlier), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["png"] == str(earlier) and earlier.read_bytes() != PNG + b"an earlier figure"
    other = tmp_path / "scratch.png"
    other.write_text("scratch")
    r = runner.invoke(app, ["stage", "curves", str(plan), "--out", str(other), "--force"])
    assert r.exit_code == 0, r.output
    assert other.read_bytes().startswith(PNG)


# -- files of the run that are not what longctx wrote -----------------------------------------------------


def _event_fifo(run: Path, tmp_path: Path) -> None:
    tb = _s1(run) / "tensorboard"
    tb.mkdir()
    os.mkfifo(tb / TB)


def _event_6gib(run: Path, tmp_path: Path) -> None:
    tb = _s1(run) / "tensorboard"
    tb.mkdir()
    os.truncate(_touch(tb / TB), 6 << 30)  # sparse: no disk used, yet 6 GiB to a reader


def _event_dev_zero(run: Path, tmp_path: Path) -> None:
    tb = _s1(run) / "tensorboard"
    tb.mkdir()
    (tb / TB).symlink_to("/dev/zero")


def _metrics_fifo(run: Path, tmp_path: Path) -> None:
    os.mkfifo(_s1(run) / "metrics.jsonl")


def _metrics_huge(run: Path, tmp_path: Path) -> None:
    os.truncate(_touch(_s1(run) / "metrics.jsonl"), 5 << 30)


def _ledger_huge(run: Path, tmp_path: Path) -> None:
    os.truncate(_touch(ledger_path(run)), 1 << 30)


def _tb_dir_outside(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / TB).write_bytes(b"\0" * 64)
    (_s1(run) / "tensorboard").symlink_to(outside)


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


HOSTILE = {
    "event-file-fifo": (_event_fifo, "is a FIFO"),
    "event-file-6gib": (_event_6gib, "6.0 GiB, more than"),
    "event-file-dev-zero": (_event_dev_zero, "a symbolic link (to /dev/zero)"),
    "event-dir-outside-the-run": (_tb_dir_outside, "lies outside the run directory"),
    "metrics-fifo": (_metrics_fifo, "is a FIFO"),
    "metrics-5gib": (_metrics_huge, "5.0 GiB, more than"),
    "ledger-1gib": (_ledger_huge, "1.0 GiB, more than"),
}


@pytest.mark.timeout(120)  # a FIFO opened by name would block here forever
@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("command", ["curves", "status"])
def test_a_run_file_that_is_no_file_of_a_run_is_refused(
    case: str, command: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    make, needle = HOSTILE[case]
    make(fresh_run, tmp_path)
    refused(["stage", command, plan], [fresh_run, tmp_path], needle=needle)


@pytest.mark.timeout(120)
def test_a_hard_linked_ledger_is_not_appended_to(fresh_run: Path, plan: Path, tmp_path: Path) -> None:
    outside = tmp_path / "someone-elses.jsonl"
    outside.write_text('{"event": "submit", "kind": "chain", "slurm_job_id": "1"}\n')
    os.link(outside, ledger_path(fresh_run))
    msg = " ".join(refused(["stage", "run", plan], [fresh_run, tmp_path], needle="hard links").split())
    assert "2 names" in msg and outside.read_text().count("\n") == 1


# -- numbers and types the readers do not expect -----------------------------------------------------------

LEDGER_RECORDS = {
    "5000-digit-integer": (
        '{"event": "end", "stage": "s1", "end_iteration": ' + "9" * 5000 + "}",
        "beyond 64 bits",
    ),
    "text-for-an-iteration": (
        '{"event": "end", "stage": "s1", "end_iteration": "abc"}',
        'end_iteration is "abc"',
    ),
    "deep-nesting": (
        '{"event": "launch", "stage": "s1", "binding": ' + "[" * 40 + "]" * 40 + "}",
        "nested deeper",
    ),
    "1e400": ('{"event": "end", "stage": "s1", "seconds": 1e400}', "beyond a 64-bit float"),
    "binding-a-list": ('{"event": "launch", "stage": "s1", "binding": [1]}', "binding is [1]"),
    "pid-true": ('{"event": "launch", "stage": "s1", "pid": true}', "pid is true"),
    "job-ids-not-a-list": (
        '{"event": "cancel", "slurm_job_ids": "123"}',
        'slurm_job_ids is "123", not a list',
    ),
    "schedule-a-list": (
        '{"event": "launch", "stage": "s1", "binding": {"schedule": [1]}}',
        "binding.schedule is [1]",
    ),
    "unknown-event": ('{"event": "teleport", "stage": "s1"}', 'event "teleport" is none longctx writes'),
    "no-event": ('{"stage": "s1", "end_iteration": 3}', "names no event"),
}


@pytest.mark.parametrize("case", sorted(LEDGER_RECORDS))
@pytest.mark.parametrize("command", [("stage", "run"), ("slurm", "status")])
def test_a_ledger_record_with_unbounded_or_mistyped_fields_is_named(
    case: str, command: tuple[str, str], fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    line, needle = LEDGER_RECORDS[case]
    ledger_path(fresh_run).write_text(line + "\n" + '{"event": "end", "stage": "s1"}\n')
    msg = refused([*command, plan], [fresh_run, tmp_path], needle=needle)
    assert "ledger line 1" in msg


METRICS_LINES = {
    "iteration-1e400": b'{"stage": "s1", "iteration": 1e400, "loss": 2.0, "lr": 0.001, "tokens_per_s": 5}',
    "iteration-minus-10-400": b'{"stage": "s1", "iteration": -1'
    + b"0" * 400
    + b', "loss": 2.0, "lr": 0.001, '
    b'"tokens_per_s": 5}',
    "loss-infinity": b'{"stage": "s1", "iteration": 1, "loss": Infinity, "lr": 0.001, "tokens_per_s": 5}',
    "loss-1e999": b'{"stage": "s1", "iteration": 1, "loss": -1e999, "lr": 0.001, "tokens_per_s": 5}',
    "loss-text": b'{"stage": "s1", "iteration": 1, "loss": "abc", "lr": 0.001, "tokens_per_s": 5}',
    "deep-nesting": b'{"stage": "s1", "iteration": 1, "loss": ' + b"[" * 50_000 + b"}",
    "line-of-4-mib": b'{"stage": "s1", "iteration": 1, "pad": "' + b"x" * (4 << 20) + b'"}',
}


@pytest.mark.parametrize("case", sorted(METRICS_LINES))
def test_metrics_lines_beyond_the_bounds_are_named_and_skipped(
    case: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    """Alone they leave nothing to draw (exit 2, the line named); among good lines the rest is drawn."""
    metrics = _s1(fresh_run) / "metrics.jsonl"
    metrics.write_bytes(_metrics(METRICS_LINES[case]))
    refused(["stage", "curves", plan], [fresh_run, tmp_path], needle="metrics.jsonl:1: not a metrics record")
    metrics.write_bytes(_metrics(_good(1), METRICS_LINES[case], _good(3)))
    r = runner.invoke(app, ["stage", "curves", str(plan), "--json"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    doc = json.loads(r.stdout)
    assert [p[0] for p in doc["stages"][0]["loss"]] == [1, 3]
    assert f"{metrics}:2: not a metrics record; skipped" in doc["problems"]
    status = runner.invoke(app, ["stage", "status", str(plan), "--json"])
    assert status.exit_code == 0 and json.loads(status.stdout)["stages"][0]["status"] == "pending"


def test_a_rate_of_5e_324_tokens_per_s_is_no_eta(fresh_run: Path, plan: Path) -> None:
    ledger_path(fresh_run).write_text(
        json.dumps({"event": "launch", "stage": "s1", "action": "first-launch", "start_iteration": 0}) + "\n"
    )
    (_s1(fresh_run) / "metrics.jsonl").write_bytes(_metrics(_good(1, 5e-324), _good(2, 5e-324)))
    r = runner.invoke(app, ["stage", "status", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    pace = json.loads(r.stdout)["stages"][0]["pace"]
    assert (
        pace["tokens_per_s"] == 5e-324
        and pace["stage_eta_seconds"] is None
        and pace["plan_eta_seconds"] is None
    )
    text = runner.invoke(app, ["stage", "status", str(plan)])
    assert text.exit_code == 0 and "Traceback" not in text.output, text.output


@pytest.mark.parametrize(
    "record",
    [
        {"host": "n1", "pid": 10**20, "job_id": None, "since": "2026-01-01", "stage": "s1"},
        {"host": "n1", "pid": -(10**400), "job_id": None, "since": "2026-01-01", "stage": "s1"},
        {"host": "n1", "pid": True, "job_id": None, "since": "2026-01-01", "stage": "s1"},
        {"host": ["n1"], "pid": 12, "job_id": None, "since": "2026-01-01", "stage": "s1"},
    ],
    ids=["pid-1e20", "pid-minus-10-400", "pid-true", "host-a-list"],
)
@pytest.mark.parametrize("command", ["status", "run"])
def test_a_lock_with_a_pid_no_process_has_is_refused(
    record: dict, command: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    lock_path(fresh_run).write_text(json.dumps(record))
    refused(["stage", command, plan], [fresh_run, tmp_path], needle="not a holder record")


# -- what a file says, printed ----------------------------------------------------------------------------

HOSTILE_HOST = "gpu01\x1b]0;owned\x07\x1b[2J\rfix: rm -rf /"
HOSTILE_JOB = "77\x1b[31m\x9b"


def test_escape_sequences_in_the_lock_are_printed_escaped(
    fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    """A lock held on another host (it cannot be checked from here): status shows it, run is refused."""
    lock_path(fresh_run).write_text(
        json.dumps(
            {"host": HOSTILE_HOST, "pid": 4242, "job_id": HOSTILE_JOB, "since": "2026-01-01", "stage": "s1"}
        )
    )
    status = runner.invoke(app, ["stage", "status", str(plan)])
    assert status.exit_code == 0, status.output
    for text in (status.output, refused(["stage", "run", plan], [fresh_run, tmp_path], needle="locked by")):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\r" not in text, repr(
            text
        )
        assert "gpu01\\x1b]0;owned" in text and "77\\x1b[31m\\x9b" in text, text
    doc = json.loads(runner.invoke(app, ["stage", "status", str(plan), "--json"]).stdout)
    assert doc["lock"]["host"] == HOSTILE_HOST  # the data itself is kept; JSON escapes it


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("a\x1b[0mb\rc\x9bd\u202ee\nf\tg é 中") == "a\\x1b[0mb\\x0dc\\x9bd\\u202ee\nf\tg é 中"
    assert one_line("a\nb\tc") == "a\\x0ab\\x09c"


# -- launch logs the ledger names ----------------------------------------------------------------------------

MEGATRON_LINE = (
    " [2026-01-01 00:00:00] iteration        {it}/       6 | consumed samples: 4 | elapsed time per iteration (ms): "
    "100.0 | learning rate: 1.000000E-03 | global batch size:     4 | lm loss: 7.500000E+00 |\n"
)


@pytest.mark.parametrize("named", ["outside.log", "passwd"])
def test_a_log_the_ledger_names_outside_the_run_is_not_read(
    named: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    outside = tmp_path / named
    outside.write_text("".join(MEGATRON_LINE.format(it=i) for i in (1, 2)))
    ledger_path(fresh_run).write_text(
        json.dumps({"event": "launch", "stage": "s1", "log": str(outside)}) + "\n"
    )
    msg = refused(["stage", "curves", plan], [fresh_run, tmp_path], needle="no training curves readable")
    assert str(outside) in " ".join(msg.split())
    # the same name in the stage's logs/ is what is read (a run that moved keeps its logs there)
    if named.endswith(".log"):
        logs = _s1(fresh_run) / "logs"
        logs.mkdir()
        shutil.copy(outside, logs / named)
        r = runner.invoke(app, ["stage", "curves", str(plan), "--json"])
        assert r.exit_code == 0, r.output
        assert [p[0] for p in json.loads(r.stdout)["stages"][0]["loss"]] == [1, 2]


@pytest.mark.timeout(120)
def test_a_launch_log_that_is_a_fifo_is_refused(fresh_run: Path, plan: Path, tmp_path: Path) -> None:
    logs = _s1(fresh_run) / "logs"
    logs.mkdir()
    os.mkfifo(logs / "20260101-000000-1.log")
    ledger_path(fresh_run).write_text(
        json.dumps({"event": "launch", "stage": "s1", "log": str(logs / "20260101-000000-1.log")}) + "\n"
    )
    refused(["stage", "curves", plan], [fresh_run, tmp_path], needle="is a FIFO")


# -- the published card, RANK, a full disk -----------------------------------------------------------------


@pytest.fixture
def card_dir(tmp_path: Path) -> Path:
    d = tmp_path / "family"
    d.mkdir()
    return d


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["dev-zero", "fifo", "2-gib"])
def test_a_card_that_is_no_card_is_refused_without_reading_it(case: str, card_dir: Path) -> None:
    card = card_dir / CARD
    if case == "dev-zero":
        card.symlink_to("/dev/zero")
    elif case == "fifo":
        os.mkfifo(card)
    else:
        os.truncate(_touch(card), 2 << 30)
    needle = {"dev-zero": "symbolic link (to /dev/zero)", "fifo": "is a FIFO", "2-gib": "2.0 GiB"}[case]
    before = tree_state(card_dir)
    with pytest.raises(CheckpointError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        read_card(card_dir)
    assert tree_state(card_dir) == before


@pytest.mark.parametrize(
    "name,value", [("RANK", "abc"), ("RANK", "3"), ("LOCAL_RANK", "-1"), ("RANK", "9" * 30)]
)
def test_eval_with_a_rank_that_is_no_rank_is_refused(
    name: str, value: str, fresh_run: Path, plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ckpt = fresh_run / "base" / "checkpoints"
    refused(
        ["eval", "run", ckpt, "--plan", plan, "--out", tmp_path / "ev"],
        [fresh_run, tmp_path],
        needle=f"{name} is {value!r}",
    )
    refused(["eval", "summary", plan], [fresh_run, tmp_path], needle=f"{name} is {value!r}")


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_adopt_with_copy_onto_a_full_disk_says_so_and_leaves_no_directory(
    small_tmpfs: Path, fresh_run: Path, tmp_path: Path
) -> None:
    into = small_tmpfs / "new" / "checkpoints"
    src = fresh_run / "base" / "checkpoints"
    msg = refused(
        ["ckpt", "adopt", src, "--into", into, "--allow-copy"],
        [small_tmpfs, fresh_run],
        needle="no space left",
    )
    assert "cannot hard-link" not in msg and not (small_tmpfs / "new").exists()


@pytest.mark.processes  # the tracked-file rule asks `git ls-files`
def test_rope_plot_out_never_lands_on_a_file_it_must_not_write(tmp_path: Path, repo_root: Path) -> None:
    """`rope plot --out` follows the same rule as `stage curves --out`: no tracked file, no package file,
    no existing file that is not a figure (without --force)."""
    from longctx.util.shipped import resource_dir

    plan_like = tmp_path / "plan.png"
    plan_like.write_text('name = "x"\n')
    args = ["rope", "plot", "--bases", "10000", "--rotary-dim", "16", "--lengths", "256"]
    for target, needle in [
        (plan_like, "is not a PNG figure"),
        (repo_root / "docs" / "niah-demo.png", "git tracks"),
        (resource_dir("demo") / "x.pdf", "inside the installed longctx package"),
    ]:
        refused([*args, "--out", target], [tmp_path, target.parent], needle=needle)


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "submit", "kind": "chain"}',
        '{"event": "submit", "kind": "chain", "slurm_job_id": [1]}',
        '{"event": "submit", "kind": "chain", "slurm_job_id": "$(rm -rf x)"}',
        '{"event": "chain-cancel", "slurm_job_ids": "123"}',
    ],
)
def test_slurm_status_reads_past_a_submit_record_without_a_job(
    line: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    """A submit record that names no Slurm job (damaged, or written by hand) is no job: no traceback."""
    from longctx.slurm.chain import submitted

    ledger_path(fresh_run).write_text(line + "\n")
    if "[1]" not in line and '"123"' not in line:  # a mistyped field is the ledger reader's refusal
        assert submitted(fresh_run) == []
    r = runner.invoke(app, ["slurm", "status", str(plan), "--json"])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    json.loads(r.stdout)  # one JSON document, whatever the exit


@pytest.mark.parametrize(
    ("args", "what"),
    [(["slurm", "render"], "the Slurm scripts"), (["eval", "summary"], "the evaluation's report and plots")],
)
def test_an_output_directory_inside_the_package_or_a_file_is_refused(
    args: list[str], what: str, fresh_run: Path, plan: Path, tmp_path: Path
) -> None:
    from longctx.util.shipped import resource_dir

    package_dir = resource_dir("demo", "new-outputs")
    refused(
        [*args, plan, "--out", package_dir],
        [fresh_run, tmp_path, resource_dir("demo")],
        needle="inside the installed longctx package",
    )
    assert not package_dir.exists()
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    refused([*args, plan, "--out", a_file], [fresh_run, tmp_path], needle="exists and is not a directory")


def test_export_out_inside_the_package_is_refused() -> None:
    from longctx.errors import OutputError
    from longctx.export.run import _check_out
    from longctx.util.shipped import resource_dir

    with pytest.raises(OutputError, match="inside the installed longctx package"):
        _check_out(resource_dir("demo", "hf"))
