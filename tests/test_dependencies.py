"""The install README line 1 makes: every dependency range is bounded above, and CI runs the demo in a
runtime-only environment made the way scripts/setup makes it."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# calendar-versioned: no major to bound
UNBOUNDED = {"regex"}


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0]


def _requirements() -> list[str]:
    extras = PYPROJECT["project"]["optional-dependencies"]
    reqs = list(PYPROJECT["project"]["dependencies"])
    return reqs + [r for rs in extras.values() for r in rs if not r.startswith("longctx")]


def test_every_range_has_a_floor_and_a_ceiling() -> None:
    for req in _requirements():
        if _name(req) in UNBOUNDED:
            continue
        assert "==" in req or ("<" in req and ">=" in req), f"{req}: give the tested floor and the next major"


def test_runtime_needs_are_runtime_dependencies() -> None:
    """What the user commands need at run time (not only a dev extra)."""
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    # protobuf: transformers 5 converts a tokenizer.model with it; psutil: megatron-core saves with it;
    # safetensors: export hf; tensorboard: the training curves
    assert {"protobuf", "psutil", "safetensors", "tensorboard", "transformers", "megatron-core"} <= runtime


def test_ci_runs_the_runtime_install_before_the_dev_install() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.index("scripts/runtime-check") < ci.index("scripts/setup --dev")
    check = ROOT / "scripts" / "runtime-check"
    subprocess.run(["bash", "-n", str(check)], check=True)
    text = check.read_text(encoding="utf-8")
    # the runtime-only install, as README line 1 makes it, then the demo and the user commands
    assert "\nscripts/setup\n" in text and "--dev" not in text
    for command in ("demo --small", "eval summary", "export hf", "ckpt check", "tokenizer check"):
        assert command in text
