"""Profiles and job settings: each bad input is a clear error (exit 2 on the CLI) naming what to change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import SlurmError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.slurm import PLAN_SLURM_KEYS
from longctx.slurm.profiles import available_profiles, load_profile
from longctx.slurm.settings import job_settings
from longctx.slurm.timefmt import parse_signal, parse_time

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, ["slurm", *[str(a) for a in args]])


def _out(res) -> str:
    return " ".join((res.stdout + (res.stderr or "")).split())


def baby_copy(
    repo_root: Path, baby_plan: Path, tmp_path: Path, *, replace: dict[str, str] | None = None
) -> Path:
    """baby_9b_dense.toml elsewhere (absolute manifest path), with text replacements."""
    text = baby_plan.read_text().replace(
        'manifest = "../tokenization/oellm-256k.toml"',
        f'manifest = "{repo_root}/tokenization/oellm-256k.toml"',
    )
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    p = tmp_path / "baby.toml"
    p.write_text(text)
    return p


def test_packaged_profiles_load() -> None:
    assert {"leonardo", "generic", "local"} <= set(available_profiles())
    leo = load_profile("leonardo")
    assert (leo.gpus_per_node, leo.cpus_per_task, leo.signal, leo.partition) == (
        4,
        32,
        "TERM@240",
        "boost_usr_prod",
    )
    assert leo.qos_limits["normal"].max_nodes == 64
    assert leo.qos_limits["boost_qos_bprod"].min_nodes == 65
    assert load_profile("local").backend == "local"


def test_unknown_profile_is_a_clear_error(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--profile", "marenostrum9", "--stdout")
    assert res.exit_code == 2
    out = _out(res)
    assert "unknown Slurm profile 'marenostrum9'" in out
    assert "generic, leonardo, local" in out


def test_profile_from_a_site_directory_and_unknown_profile_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mycluster.toml").write_text('name = "mycluster"\ngpus_per_node = 4\npartition = "gpu"\n')
    (tmp_path / "typo.toml").write_text("gpus_per_nod = 4\n")
    monkeypatch.setenv("LONGCTX_SLURM_PROFILES", str(tmp_path))
    assert load_profile("mycluster").partition == "gpu"
    assert load_profile(str(tmp_path / "mycluster.toml")).name == "mycluster"
    with pytest.raises(SlurmError, match=r"gpus_per_nod: unknown key"):
        load_profile("typo")


def test_plan_needing_more_nodes_than_the_qos_allows(
    repo_root: Path, baby_plan: Path, tmp_path: Path
) -> None:
    plan = baby_copy(
        repo_root,
        baby_plan,
        tmp_path,
        replace={"nodes = 32": "nodes = 128", "max_nodes = 64": "max_nodes = 256"},
    )
    res = cli("render", plan, "--stdout")
    assert res.exit_code == 2
    out = _out(res)
    assert "the chain job needs 128 nodes, but QoS 'normal' of profile 'leonardo' allows at most 64" in out
    assert "boost_qos_bprod" in out  # the fix names a QoS that fits
    # and on the command line: 32 nodes in the 2-node debug QoS
    res = cli("render", baby_plan, "--qos", "boost_qos_dbg", "--stdout")
    assert res.exit_code == 2
    assert "needs 32 nodes, but QoS 'boost_qos_dbg' of profile 'leonardo' allows at most 2" in _out(res)


def test_time_limit_shorter_than_exit_duration_plus_margin(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--time", "23:00:00", "--stdout")
    assert res.exit_code == 2
    out = _out(res)
    assert (
        "time limit 23:00:00 (1380 min) is shorter than stage 16k's exit_duration_in_mins 1410 + save margin 10 "
        "= 1420 min"
    ) in out
    assert "raise the time limit to at least 23:40:00, or set exit_duration_in_mins <= 1370" in out
    # exactly at the margin is fine
    assert cli("render", baby_plan, "--time", "23:40:00", "--stdout").exit_code == 0


def test_time_over_the_qos_maximum(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--time", "2-00:00:00", "--stdout")
    assert res.exit_code == 2
    assert "time limit 2-00:00:00 exceeds QoS 'normal''s maximum 24:00:00" in _out(res)


def test_signal_checks(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--signal", "B:TERM@240", "--stdout")
    assert res.exit_code == 2
    assert "'B:' signals only the batch shell" in _out(res)
    res = cli("render", baby_plan, "--signal", "USR1@240", "--stdout")
    assert res.exit_code == 2
    assert "the megatron-lm backend saves on TERM, not USR1" in _out(res)
    res = cli("render", baby_plan, "--time", "1", "--signal", "TERM@90", "--backend", "local", "--stdout")
    assert res.exit_code == 2


def test_unknown_slurm_key_in_the_plan(repo_root: Path, baby_plan: Path, tmp_path: Path) -> None:
    plan = baby_copy(repo_root, baby_plan, tmp_path, replace={'qos = "normal"': 'qos = "normal"\nqoss = "x"'})
    res = cli("render", plan, "--stdout")
    assert res.exit_code == 2
    out = _out(res)
    assert "unknown key in the plan's slurm table: qoss" in out
    assert "use only: " + ", ".join(PLAN_SLURM_KEYS) in out


def test_gpus_per_node_must_match_the_profile(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--profile", "generic", "--stdout")
    assert res.exit_code == 2
    assert "the plan says 4 GPUs per node, profile 'generic' has 8" in _out(res)


def test_bad_time_format(baby_plan: Path) -> None:
    res = cli("render", baby_plan, "--time", "24h", "--stdout")
    assert res.exit_code == 2
    assert "'24h' is not a Slurm time limit" in _out(res)


def test_settings_merge_profile_plan_cli(baby_plan: Path) -> None:
    rp = resolve_plan(load_plan(baby_plan))
    s = job_settings(rp, overrides={"partition": "boost_usr_prod", "qos": "qos_oellm"})
    assert s.profile.qos == "qos_oellm"  # CLI over plan
    assert s.profile.account == "OELLM_prod2026"  # plan over profile
    assert s.profile.env["NCCL_IB_TIMEOUT"] == "120"  # profile
    assert s.profile.container is not None and s.profile.container.image.endswith("nemo_25.11.01.sif")
    assert s.profile.container.binds == ["/leonardo_scratch", "/leonardo", "/leonardo_work"]
    assert (s.nodes, s.gpus_per_node, s.time_seconds, s.signal.directive()) == (32, 4, 86400, "TERM@240")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 60),
        ("90", 5400),
        ("1:30", 90),
        ("24:00:00", 86400),
        ("1-12", 129600),
        ("4-00:00:00", 345600),
        ("2-03:04", 183840),
    ],
)
def test_parse_time(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


def test_parse_signal() -> None:
    assert parse_signal("TERM@240").directive() == "TERM@240"
    assert parse_signal("SIGUSR1@90").directive() == "USR1@90"
    assert parse_signal("15@60").name == "TERM"
    assert parse_signal("R:TERM@60").directive() == "R:TERM@60"
    with pytest.raises(SlurmError, match="not a signal the trainers save on"):
        parse_signal("HUP@60")


def test_generic_profile_lists_every_key() -> None:
    """generic.toml is the template for new clusters: every profile key appears in it (set or commented)."""
    from longctx.slurm.profiles import Profile, profile_path

    text = profile_path("generic").read_text()
    missing = [k for k in Profile.model_fields if not re.search(rf"^(# )?\[?{k}[\].= ]", text, re.M)]
    assert missing == []
