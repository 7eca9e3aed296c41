"""The shell helpers CI runs (scripts/oldest-python, scripts/runtime-check, scripts/wheel-check) against a
hostile environment: interpreters that print code, hang or fail; work directories reached through links
into the checkout, not empty, or not directories. Each is refused or skipped with nothing created and
nothing executed, in bounded time."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
PROBE_S = 10  # scripts/oldest-python's time for one interpreter to answer


def _fake(bin_dir: Path, name: str, body: str) -> Path:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _run(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_oldest_python_reads_versions_as_data_and_skips_odd_interpreters(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    assert "." not in str(marker), "the injected path must survive the split on dots"
    fakes = tmp_path / "bin"
    fakes.mkdir()
    # bash arithmetic expands an array subscript: the old script ran this `$(…)`
    _fake(fakes, "python3.12", f"echo 'floor[$(touch {marker})].1.1'")
    _fake(fakes, "python3.13", "sleep 1000")  # never answers
    _fake(fakes, "python3.14", "exit 3")  # fails
    _fake(fakes, "python3", "echo 3.11.9; echo and more")  # not one version line
    oldest = _fake(fakes, "python3.11", "echo 3.11.1")  # older than any real 3.11 here
    env = dict(os.environ, PATH=f"{fakes}:{os.environ['PATH']}")
    t0 = time.monotonic()
    res = _run(["bash", str(SCRIPTS / "oldest-python")], env=env, timeout=PROBE_S + 50)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "a version's `$(…)` was executed"
    assert elapsed < PROBE_S + 20, f"a hanging interpreter held the script {elapsed:.0f} s"
    assert res.stdout.strip() == str(oldest), res.stderr
    err = res.stderr
    assert f"skipping {fakes / 'python3.12'}: it printed" in err and "not a version" in err, err
    assert f"skipping {fakes / 'python3.13'}: it did not answer within {PROBE_S} s" in err, err
    assert f"skipping {fakes / 'python3.14'}: it exited with 3" in err, err
    assert f"skipping {fakes / 'python3'}: it printed" in err, err


def _fake_checkout(tmp_path: Path, script: str) -> tuple[Path, Path]:
    """A checkout holding only `script` and the helper it sources, and a symlink to it."""
    real = tmp_path / "checkout"
    (real / "scripts" / "lib").mkdir(parents=True)
    shutil.copy2(SCRIPTS / script, real / "scripts" / script)
    shutil.copy2(SCRIPTS / "lib" / "work-dir.bash", real / "scripts" / "lib" / "work-dir.bash")
    link = tmp_path / "link"
    link.symlink_to(real)
    return real, link


def _tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*")}


CHECKS = ("runtime-check", "wheel-check")


@pytest.mark.parametrize("script", CHECKS)
@pytest.mark.parametrize(
    ("invoked_through", "work"),
    [
        ("checkout", "link/work"),  # a link into the checkout looks like a directory outside it
        ("link", "checkout/work"),  # the checkout reached through a link, the work dir by its real path
        ("checkout", "link/a/b/c"),  # nested, missing: nothing of it may be created
        ("link", "link"),  # the checkout itself
    ],
)
def test_a_work_dir_inside_the_checkout_is_refused_before_anything_is_written(
    tmp_path: Path, script: str, invoked_through: str, work: str
) -> None:
    real, _ = _fake_checkout(tmp_path, script)
    before = _tree(tmp_path)
    res = _run(["bash", str(tmp_path / invoked_through / "scripts" / script), str(tmp_path / work)])
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert f"is inside the checkout {real}" in res.stderr and "give a directory outside it" in res.stderr
    assert _tree(tmp_path) == before, "a refused work dir was created"


@pytest.mark.parametrize("script", CHECKS)
def test_a_temporary_dir_inside_the_checkout_is_refused(tmp_path: Path, script: str) -> None:
    _, link = _fake_checkout(tmp_path, script)
    (tmp_path / "checkout" / "tmp").mkdir()
    before = _tree(tmp_path)
    env = dict(os.environ, TMPDIR=str(link / "tmp"))
    res = _run(["bash", str(tmp_path / "checkout" / "scripts" / script)], env=env)
    assert res.returncode == 2 and "is inside the checkout" in res.stderr, res.stderr
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("script", CHECKS)
@pytest.mark.parametrize(("kind", "needle"), [("file", "is not a directory"), ("full", "is not empty")])
def test_a_work_dir_that_is_not_new_or_empty_is_refused(
    tmp_path: Path, script: str, kind: str, needle: str
) -> None:
    _fake_checkout(tmp_path, script)
    work = tmp_path / "work"
    if kind == "file":
        work.write_text("mine\n")
    else:
        work.mkdir()
        (work / "mine.txt").write_text("mine\n")
    before = _tree(tmp_path)
    res = _run(["bash", str(tmp_path / "checkout" / "scripts" / script), str(work)])
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert _tree(tmp_path) == before
