"""Rendered batch scripts: the Leonardo golden files, determinism, and quoting that no value can escape."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.errors import SlurmError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm.quote import check_text, fill, sbatch_word, sh, slurm_filename
from longctx.slurm.script import render

GOLDEN = Path(__file__).parent / "golden" / "baby_9b_dense.leonardo"
LONGCTX = ["/opt/longctx/.venv/bin/python", "-m", "longctx"]
UPDATE_ENV = "LONGCTX_UPDATE_GOLDEN"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "LONGCTX_BABY_RUN_DIR",
        "BABY_9B_CHECKPOINTS",
        "OELLM_TOKENIZER",
        "OELLM_LONGCTX_DATA",
        "LONGCTX_RUN_DIR",
        "LONGCTX_SLURM_PROFILES",
        "LONGCTX_MEGATRON_LM",
    ):
        monkeypatch.delenv(var, raising=False)


def _baby_rendered(baby_plan: Path):
    return render(
        resolve_plan(load_plan(baby_plan)),
        profile="leonardo",
        longctx_command=LONGCTX,
        out_dir=Path("/leonardo_scratch/fast/OELLM_prod2026/longctx/baby_9b_dense/slurm"),
    )


def test_leonardo_golden(clean_env: None, baby_plan: Path, repo_root: Path) -> None:
    rendered = _baby_rendered(baby_plan)
    assert [s.name for s in rendered.scripts] == [
        "chain.sbatch",
        "eval-16k.sbatch",
        "eval-64k.sbatch",
        "eval-128k.sbatch",
    ]
    assert rendered.warnings == (
        "no Megatron-LM checkout given (plan megatron.path or slurm.megatron_lm): the jobs need "
        "$LONGCTX_MEGATRON_LM exported in the shell that submits them",
    )
    for s in rendered.scripts:
        text = s.text.replace(str(repo_root), "@REPO@")
        golden = GOLDEN / s.name
        if os.environ.get(UPDATE_ENV) == "1":
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert text == golden.read_text(), f"{s.name} differs from {golden} (set {UPDATE_ENV}=1 to rewrite)"


def test_leonardo_chain_script_essentials(clean_env: None, baby_plan: Path) -> None:
    text = _baby_rendered(baby_plan).chain.text
    for line in (
        "#SBATCH --signal=TERM@240",
        "#SBATCH --time=24:00:00",
        "#SBATCH --nodes=32",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=32",
        "#SBATCH --qos=normal",
        "#SBATCH --account=OELLM_prod2026",
        "#SBATCH --partition=boost_usr_prod",
        "#SBATCH --exclude='lrdn[0337,0417,2658]'",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "export NCCL_IB_TIMEOUT=120",
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "export HF_HUB_OFFLINE=1",
        "--backend megatron-lm --launcher srun",
        'slurm job-end "$plan"',
    ):
        assert line in text, line
    assert "B:" not in text
    cfg = json.loads(
        shlex.split(next(x for x in text.splitlines() if "LONGCTX_SRUN_CONFIG=" in x))[1].split("=", 1)[1]
    )
    assert cfg["container"]["image"] == "/leonardo_work/OELLM_prod2026/container_images/nemo_25.11.01.sif"
    assert cfg["container"]["binds"] == ["/leonardo_scratch", "/leonardo", "/leonardo_work"]
    assert cfg["master_port"] == 20074 and cfg["cpus_per_task"] == 32


def test_render_is_deterministic_and_writes_executables(
    clean_env: None, baby_plan: Path, tmp_path: Path
) -> None:
    rp = resolve_plan(load_plan(baby_plan))
    a = render(rp, out_dir=tmp_path / "a", longctx_command=LONGCTX)
    b = render(rp, out_dir=tmp_path / "a", longctx_command=LONGCTX)
    assert [s.text for s in a.scripts] == [s.text for s in b.scripts]
    written = a.write()
    assert [p.name for p in written] == [s.name for s in a.scripts]
    assert all(p.stat().st_mode & stat.S_IXUSR for p in written)
    assert (rp.run_dir / "logs").is_dir() or str(rp.run_dir).startswith("/leonardo")


def test_local_profile_script(tiny_plan_copy: Path) -> None:
    rendered = render(
        resolve_plan(load_plan(tiny_plan_copy)),
        overrides={"time": "1", "signal": "TERM@30"},
        longctx_command=LONGCTX,
    )
    text = rendered.chain.text
    # eval jobs only for megatron-lm; the 4K stage's RoPE sweep: its branches' job array and choose job
    assert [s.name for s in rendered.scripts] == ["chain.sbatch", "sweep-4k.sbatch", "choose-4k.sbatch"]
    assert "#SBATCH --time=1\n" in text and "#SBATCH --signal=TERM@30\n" in text
    assert "--gres" not in text and "--gpus-per-node" not in text
    assert "--backend local --launcher srun --sweep-branches array" in text
    branches, choose = (s.text for s in rendered.scripts[1:])
    assert 'rope sweep "$plan"' in branches and "--stage 4k" in branches
    assert '--branch-index "$SLURM_ARRAY_TASK_ID"' in branches and "--branch-index" not in choose


def test_eval_jobs_on_the_local_backend_when_asked(tiny_plan_copy: Path) -> None:
    """`rehearse --slurm` asks for them: its `stage run` does not evaluate inside the chain's jobs."""
    rp = resolve_plan(load_plan(tiny_plan_copy))
    rendered = render(
        rp, overrides={"time": "1", "signal": "TERM@30"}, longctx_command=LONGCTX, eval_jobs=True
    )
    evals = [s for s in rendered.scripts if s.kind == "eval"]
    assert [s.stage for s in evals] == [stage.name for stage in rp.stages]
    for script, stage in zip(evals, rp.stages, strict=True):
        assert "eval run " in script.text and str(stage.save_dir / "iter_") in script.text


@pytest.fixture
def tiny_plan_copy(repo_root: Path, tmp_path: Path) -> Path:
    """stages/tiny.toml with its run dir in tmp (rendering needs no artefacts but the manifest path)."""
    text = (repo_root / "stages" / "tiny.toml").read_text()
    pinned = 'manifest = "../demo/ar/tokenizer.toml"'
    assert pinned in text
    text = text.replace(pinned, f'manifest = "{repo_root}/tokenization/gpt2.toml"')
    text = text.replace('run_dir = "../runs/tiny"', f'run_dir = "{tmp_path / "run"}"')
    p = tmp_path / "tiny.toml"
    p.write_text(text)
    return p


# -- quoting ---------------------------------------------------------------------------------------


def _hostile_plan(repo_root: Path, baby_plan: Path, tmp_path: Path, canary: Path) -> Path:
    text = baby_plan.read_text().replace(
        'manifest = "../tokenization/oellm-256k.toml"',
        f'manifest = "{repo_root}/tokenization/oellm-256k.toml"',
    )
    start = text.index("[slurm]")
    end = text.index("[defaults]")
    hostile = f"""[slurm]
account = "acct $(touch {canary}) x"
partition = "boost_usr_prod"
qos = "normal"
time = "24:00:00"
exclude = "lrdn[1] `touch {canary}`; touch {canary}"
container = "/images/it's a \\"sif\\" $(touch {canary}).sif"
job_name = "baby #1 'q' $HOME"

[slurm.env]
WEIRD = "x'y\\"z $(touch {canary}) `touch {canary}` \\\\n $HOME ;"

"""
    p = tmp_path / "hostile.toml"
    p.write_text(text[:start] + hostile + text[end:])
    return p


def test_no_value_can_change_the_script(
    clean_env: None, repo_root: Path, baby_plan: Path, tmp_path: Path
) -> None:
    canary = tmp_path / "pwned"
    plan = _hostile_plan(repo_root, baby_plan, tmp_path, canary)
    run_dir = tmp_path / "run dir 'x' $(touch pwned2) `y`"
    bin_dir = tmp_path / "bin 'q' $(z)"
    bin_dir.mkdir()
    fake = bin_dir / "fake longctx"
    record = tmp_path / "calls.jsonl"
    fake.write_text(
        "#!" + sys.executable + "\nimport json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'env': "
        "{k: os.environ.get(k) for k in ('WEIRD', 'LONGCTX_RUN_DIR', 'LONGCTX_SRUN_CONFIG')}}) + '\\n')\n"
    )
    fake.chmod(0o755)
    rp = resolve_plan(load_plan(plan, run_dir=run_dir))
    rendered = render(rp, longctx_command=[str(fake)])
    rendered.write()
    script = rendered.path(rendered.chain)
    text = script.read_text()

    # the #SBATCH lines hold exactly one word each (sbatch parses them like a shell, see quote.py)
    directives = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            (word,) = shlex.split(line[len("#SBATCH ") :])
            key, _, value = word.partition("=")
            directives[key] = value
    assert directives["--account"] == f"acct $(touch {canary}) x"
    assert directives["--exclude"] == f"lrdn[1] `touch {canary}`; touch {canary}"
    assert directives["--job-name"] == "baby #1 'q' $HOME"
    assert directives["--output"] == str(run_dir).replace("%", "%%") + "/logs/slurm-%j.log"

    # run the body with bash: the fake longctx records what it got
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["argv"][:2] for c in calls] == [["stage", "run"], ["slurm", "job-end"]]
    assert calls[0]["argv"][2] == str(plan.resolve())
    assert calls[0]["argv"][3:5] == ["--run-dir", str(run_dir)]
    assert calls[1]["argv"][-2:] == ["--scripts-dir", str(rendered.out_dir)]
    env_seen = calls[0]["env"]
    assert env_seen["WEIRD"] == f"x'y\"z $(touch {canary}) `touch {canary}` \\n $HOME ;"
    assert env_seen["LONGCTX_RUN_DIR"] == str(run_dir)
    assert json.loads(env_seen["LONGCTX_SRUN_CONFIG"])["container"]["image"] == (
        f'/images/it\'s a "sif" $(touch {canary}).sif'
    )
    assert not canary.exists() and not (tmp_path / "pwned2").exists()


def test_control_characters_are_refused(clean_env: None, baby_plan: Path) -> None:
    rp = resolve_plan(load_plan(baby_plan))
    with pytest.raises(SlurmError, match="control character"):
        render(rp, overrides={"account": "acct\nrm -rf /"}, longctx_command=LONGCTX)
    with pytest.raises(SlurmError, match="control character"):
        sh("a\rb")


_TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)


@settings(max_examples=25, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=8))
def test_sbatch_word_is_one_bash_word(values: list[str]) -> None:
    script = "printf '%s\\0' " + " ".join(sbatch_word(v) for v in values)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:-1] == values


def test_quote_helpers() -> None:
    assert sbatch_word("") == "''"
    assert sbatch_word("a\\b c") == "a\\\\'b c'"
    assert slurm_filename("/x/50%/y") == "/x/50%%/y"
    with pytest.raises(SlurmError, match="backslash"):
        slurm_filename("/x\\y")
    assert check_text("ok", "x") == "ok"
    assert fill("a {{ x }} b", {"x": "1"}, where="t") == "a 1 b"
    with pytest.raises(SlurmError, match="has no value"):
        fill("{{ y }}", {}, where="t")
    with pytest.raises(SlurmError, match="no placeholder"):
        fill("none", {"x": "1"}, where="t")
