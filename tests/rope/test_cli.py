"""`longctx rope …`: output, JSON, exit codes, and a clear message for each bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, ["rope", *[str(a) for a in args]])


def test_suggest_table() -> None:
    res = cli(
        "suggest",
        "--rotary-dim",
        128,
        "--base",
        100000,
        "--from-length",
        4096,
        "--lengths",
        "16384,65536,131072",
    )
    assert res.exit_code == 0, res.output
    for text in (
        "men-safe ★",
        "--rotary-base 1200000",
        "--rotary-base 8400000",
        "--rotary-base 31000000",
        "exact 4,870,010, paper 7,800,000, fit 9,092,264",
    ):
        assert text in res.stdout


def test_suggest_json_and_size_suffixes() -> None:
    res = cli(
        "suggest",
        "--rotary-dim",
        128,
        "--base",
        "1e5",
        "--from-length",
        "4K",
        "--lengths",
        "16K,64K",
        "--json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [row["recommended"] for row in data["lengths"]] == [1_200_000, 8_400_000]
    choice = data["lengths"][0]["choices"][0]
    assert choice["method"] == "fixed" and "first_failing_position" in choice["diagnostics"]


def test_suggest_explain_and_scaling() -> None:
    res = cli(
        "suggest",
        "--rotary-dim",
        128,
        "--base",
        10000,
        "--from-length",
        4096,
        "--lengths",
        "16K",
        "--scaling",
        "--explain",
    )
    assert res.exit_code == 0, res.output
    assert "yarn" in res.stdout and "d_extra" in res.stdout


def test_check_passes_with_a_dip() -> None:
    res = cli("check", "--base", 1000000, "--rotary-dim", 128, "--length", 32768, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["ok"] is True and data["first_failing_position"] == 27_115
    assert data["men_bound"] == 630_740 and data["passes_bound"] is True
    assert [f["code"] for f in data["findings"]] == ["cos-sum-dip", "below-men-safe"]


def test_check_fails_below_the_bound() -> None:
    res = cli("check", "--base", 1000000, "--rotary-dim", 128, "--length", 65536)
    assert res.exit_code == 2
    assert "below Men's bound 2,091,624 for 65,536 tokens" in res.output
    assert "below the bound" in res.stdout
    res = cli("check", "--base", 1000000, "--rotary-dim", 128, "--length", 65536, "--json")
    assert res.exit_code == 2
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["first_failing_position"] == 27_115
    assert data["findings"][0]["level"] == "error"


def test_check_with_pretraining_inputs() -> None:
    res = cli(
        "check",
        "--base",
        50000,
        "--rotary-dim",
        128,
        "--length",
        4096,
        "--pretrain-base",
        100000,
        "--from-length",
        4096,
        "--json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["liu_d_extra"] == 74
    assert "base-below-pretrain" in [f["code"] for f in data["findings"]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--base", 0, "--rotary-dim", 128, "--length", 4096], "rotary base must be greater than 1"),
        (["check", "--base", "-5", "--rotary-dim", 128, "--length", 4096], "not a base"),
        (["check", "--base", "1.5", "--rotary-dim", 128, "--length", 4096], "must be an integer"),
        (["check", "--base", "500K", "--rotary-dim", 128, "--length", 4096], "not a base"),
        (["check", "--base", 10000, "--rotary-dim", 127, "--length", 4096], "rotary dim must be even"),
        (["check", "--base", 10000, "--rotary-dim", 128, "--length", 0], "--length: must be positive"),
        (["check", "--base", 10000, "--rotary-dim", 128], "no length to check the base for"),
        (["check", "--length", 4096, "--rotary-dim", 128], "no base to check"),
        (["check", "--base", 10000, "--length", 4096], "the rotary dim is not known"),
        (
            ["suggest", "--rotary-dim", 128, "--base", 10000, "--from-length", 4096, "--lengths", "2K"],
            "target length 2,048 is shorter than the pretraining length 4,096",
        ),
        (["suggest", "--rotary-dim", 128, "--from-length", 4096, "--lengths", "16K"], "--base not given"),
        (
            ["suggest", "--rotary-dim", 128, "--base", 10000, "--from-length", 4096, "--lengths", "16K,x"],
            "not a number",
        ),
        (
            [
                "choose",
                "magic",
                "--rotary-dim",
                128,
                "--base",
                10000,
                "--from-length",
                4096,
                "--length",
                "16K",
            ],
            "unknown RoPE method 'magic'",
        ),
        (
            [
                "choose",
                "fixed",
                "--rotary-dim",
                128,
                "--base",
                10000,
                "--from-length",
                4096,
                "--length",
                "16K",
            ],
            "method 'fixed' needs parameter 'base'",
        ),
        (
            [
                "choose",
                "abf",
                "--rotary-dim",
                128,
                "--base",
                10000,
                "--from-length",
                4096,
                "--length",
                "16K",
                "-p",
                "x",
            ],
            "expected NAME=VALUE",
        ),
    ],
)
def test_bad_inputs(args: list, message: str) -> None:
    res = cli(*args)
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output


def test_choose_with_flags() -> None:
    res = cli(
        "choose",
        "men-safe",
        "--rotary-dim",
        128,
        "--base",
        100000,
        "--from-length",
        "4K",
        "--length",
        "128K",
        "--megatron",
        "0.16.1",
        "--json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["choice"]["base"] == 31_000_000
    assert data["megatron_flags"] == ["--position-embedding-type", "rope", "--rotary-base", "31000000"]
    res = cli(
        "choose",
        "yarn",
        "--rotary-dim",
        128,
        "--base",
        1000000,
        "--from-length",
        "32K",
        "--length",
        "128K",
        "--megatron",
        "0.16.1",
    )
    assert res.exit_code == 2
    assert "exist for GPT only from megatron-core 0.19.0" in " ".join(res.output.split())
    res = cli(
        "choose",
        "fixed",
        "-p",
        "base=50000",
        "--rotary-dim",
        128,
        "--base",
        100000,
        "--from-length",
        "4K",
        "--length",
        "16K",
    )
    assert res.exit_code == 0 and "base-below-pretrain" in res.stdout


def test_methods_listing() -> None:
    res = cli("methods", "--json")
    assert res.exit_code == 0
    names = [m["name"] for m in json.loads(res.stdout)]
    assert names == ["fixed", "abf", "men", "men-safe", "liu", "ntk", "yarn", "llama3", "linear"]


def test_plot_writes_an_image(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "cossum.png"
    res = cli(
        "plot", "--bases", "1e6,31000000", "--rotary-dim", 128, "--lengths", "16K,32K", "--out", out, "--json"
    )
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(res.stdout)
    assert data["first_failing_position"] == {"1000000": 27_115, "31000000": None}
    assert data["max_position"] == 36_044
    assert [p.name for p in out.parent.iterdir()] == ["cossum.png"]  # no temp file left


def test_plot_bad_inputs(tmp_path: Path) -> None:
    res = cli("plot", "--bases", "1e6", "--rotary-dim", 128, "--lengths", "16K", "--out", tmp_path / "x.gif")
    assert res.exit_code == 2 and "end the file name in .png, .svg or .pdf" in res.output
    assert not (tmp_path / "x.gif").exists()


def test_from_checkpoint(megatron_checkpoints) -> None:
    # the fixture's gqa model: kv_channels 16, full rotary, base 10,000, trained at 64 tokens
    ckpt = megatron_checkpoints.save_dir("gqa")
    res = cli("check", "--from-checkpoint", ckpt, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["rotary_dim"], data["base"], data["length"]) == (16, 10_000, 64)
    assert data["men_bound"] == 1_707 and data["liu_d_extra"] is not None
    res = cli("suggest", "--from-checkpoint", ckpt, "--lengths", "256", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["rotary_dim"], data["pretrain_base"], data["pretrain_length"]) == (16, 10_000, 64)
    assert data["lengths"][0]["recommended"] == 34_000  # 4 × 8,578 → two significant digits
    # explicit options win over the checkpoint
    res = cli("check", "--from-checkpoint", ckpt, "--rotary-dim", 32, "--base", 100, "--length", 64, "--json")
    assert res.exit_code == 2  # 100 is below the bound 315 for rotary dim 32 at 64 tokens
    assert json.loads(res.stdout)["rotary_dim"] == 32


def test_bench_runs_and_agrees_with_the_plain_search() -> None:
    res = runner.invoke(app, ["bench", "rope", "--lengths", "1K,2K", "--baseline-length", "512", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["same_answer"] is True and set(data["search_s"]) == {"1024", "2048"}
