"""Every sub-app of `longctx` loads, and one that fails to import stops the CLI with a message (exit 2)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from longctx.cli import main
from longctx.cli.main import app


def test_every_subapp_is_registered() -> None:
    out = CliRunner().invoke(app, ["--help"]).output
    for _, name in main.SUBAPPS:
        assert name in out
    assert "demo" in out


def test_a_subapp_that_fails_to_import_is_an_error(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "longctx.cli.broken", None)  # importing it raises ImportError
    with pytest.raises(SystemExit) as info:
        main._load("broken")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "`longctx broken` commands cannot be loaded" in err
    assert "ModuleNotFoundError" in err and "where: longctx.cli.broken" in err
