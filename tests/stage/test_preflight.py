"""The preflight puts a stage's exact argv through the real Megatron-LM checkout ($LONGCTX_MEGATRON_LM):
parse_args(ignore_unknown_args=False), validate_args, core_transformer_config_from_args and the rotary base
of the model its entry script builds, with the target's device facts standing in for the missing GPU.

Each preflight is one child process (a few seconds of imports), so the checks of several stages share one.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import ResolvedPlan, resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm.commands import preflight_facts
from longctx.slurm.profiles import load_profile
from longctx.stage.preflight import (
    DeviceFacts,
    PreflightError,
    StageJob,
    preflight_plan,
    require_passed,
    run_preflight,
    stage_job,
)
from tests.fixtures.mask_diff_fork import ENTRY_SCRIPT, make_mask_diff_fork

REPO = Path(__file__).resolve().parents[2]
A100 = DeviceFacts("test: A100 nodes with TE", gpu_arch=(8, 0), env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


@pytest.fixture
def baby(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """baby_9b_dense with a manifests-only artifact (as in test_megatron_args.py); no tokenizer on disk."""
    from tests.fixtures.artifact import build_artifact

    art = build_artifact(tmp_path / "artifact", run="lc16k_full_20260507")
    for f in list(art.rglob("*.bin")) + list(art.rglob("*.idx")):
        f.unlink()
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(art))
    monkeypatch.setenv("LONGCTX_BABY_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("BABY_9B_CHECKPOINTS", raising=False)
    monkeypatch.delenv("OELLM_TOKENIZER", raising=False)
    return resolve_plan(load_plan(REPO / "stages" / "baby_9b_dense.toml"))


def _tiny_plan(tmp_path: Path, extra: str = "") -> Path:
    """stages/tiny.toml with its run dir in tmp and a manifest that exists (no tokenizer, data or base)."""
    text = (REPO / "stages" / "tiny.toml").read_text()
    pinned = 'manifest = "../demo/ar/tokenizer.toml"'
    assert pinned in text
    text = text.replace(pinned, f'manifest = "{REPO}/tokenization/gpt2.toml"')
    text = text.replace('run_dir = "../runs/tiny"', f'run_dir = "{tmp_path / "run"}"')
    # the demo packs by document on the local backend; Megatron-LM 0.16 has no such packing
    text = text.replace('packing = "documents", reset_position_ids = true', 'packing = "concat"')
    if extra:
        text = text.replace('name = "1k"\n', f'name = "1k"\n{extra}\n', 1)
    p = tmp_path / "tiny.toml"
    p.write_text(text)
    return p


def _ermine():
    return resolve_plan(load_plan(REPO / "stages" / "ermine_arm.toml"))


def test_every_stage_of_every_plan_passes(megatron_lm: Path, baby, tmp_path: Path) -> None:
    tiny = resolve_plan(load_plan(_tiny_plan(tmp_path)))
    plans = {"baby_9b_dense": baby, "ermine_arm": _ermine(), "tiny": tiny}
    # tiny's 4K stage sweeps its RoPE base: its branches are what launches first, one argv per candidate
    jobs = [stage_job(rp, st) for rp in plans.values() for st in rp.launchable()]
    t0 = time.monotonic()
    report = run_preflight(megatron_lm / "pretrain_gpt.py", jobs, A100)
    print(f"preflight of {len(jobs)} stages: {time.monotonic() - t0:.1f} s")
    assert report.ok, "\n".join(report.lines())
    assert [s.stage for s in report.stages] == [j.name for j in jobs]
    for job, s in zip(jobs, report.stages, strict=True):
        assert s.passed() == ["entry-script", "parse_args", "validate_args", "transformer_config", "rotary"]
        assert s.rotary is not None and s.rotary["model_class"].endswith("GPTModel")
        assert s.rotary["applied_base"] == pytest.approx(job.rotary_base, rel=1e-4)
        assert s.rotary["positions"] == job.seq_length
    # TP or CP > 1 (baby 64k: CP 4): validate_args asked for the GPU arch, answered from the facts;
    # TP = CP = 1 (ermine 8k) asks nothing
    by = {s.stage: s for s in report.stages}
    assert by["64k"].device_calls.get("get_device_properties", 0) >= 1
    assert by["8k"].device_calls.get("get_device_properties", 0) == 0


def test_megatron_refuses_with_its_own_message(megatron_lm: Path) -> None:
    rp = _ermine()
    base = stage_job(rp, rp.stage("8k"))
    words = list(base.argv)
    float_base = words.copy()
    float_base[float_base.index("--rotary-base") + 1] = "1.3e6"  # the plan never emits it; a raw argv can
    layout = words.copy()
    layout[layout.index("--tensor-model-parallel-size") + 1] = "3"
    jobs = [
        StageJob("float-base", float_base, 4, 4),
        StageJob("layout", layout, 4, 4),
    ]
    report = run_preflight(megatron_lm / "pretrain_gpt.py", jobs, A100)
    by = {s.stage: s for s in report.stages}
    fb = by["float-base"].failure
    assert fb is not None and fb.name == "parse_args"
    assert "argument --rotary-base: invalid int value: '1.3e6'" in (fb.message or "")
    lay = by["layout"].failure
    assert lay is not None and lay.name == "validate_args"
    assert "world size (4) is not divisible by total_model_size" in (lay.message or "")
    assert lay.where and "arguments.py" in lay.where
    with pytest.raises(PreflightError, match="refuses stage float-base at parse_args") as err:
        require_passed(report)
    assert err.value.report is report and "also refused: layout" in err.value.what


def test_launch_environment_and_transformer_engine_facts(megatron_lm: Path, tmp_path: Path) -> None:
    """The local profile: no GPU, no TE, and a launch environment without CUDA_DEVICE_MAX_CONNECTIONS."""
    rp = resolve_plan(load_plan(_tiny_plan(tmp_path)))
    facts = preflight_facts(load_profile("local"), environ={})
    assert facts.gpu_arch is None and facts.transformer_engine is None
    assert facts.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # what longctx's launch sets
    facts = DeviceFacts.cpu("local profile, launch env without CUDA_DEVICE_MAX_CONNECTIONS")
    report = preflight_plan(rp, facts, script=megatron_lm / "pretrain_gpt.py")
    one, *fours = report.stages  # 1k, then the 4k stage's sweep branches (its base is pending)
    assert [f.stage for f in fours] == [b.name for b in rp.stage("4k").branches]
    # 1k (TP = CP = 1): TransformerConfig wants TE for the RoPE fusion longctx leaves on
    assert one.failure is not None and one.failure.name == "transformer_config"
    assert "apply_rope_fusion is not available" in (one.failure.message or "")
    # 4k (CP 2): validate_args asks for CUDA_DEVICE_MAX_CONNECTIONS=1 on pre-Blackwell GPUs — here the GPU
    # arch query itself is refused: the target has no GPU
    for four in fours:
        assert four.failure is not None and four.failure.name == "validate_args"
        assert "has no GPU" in (four.failure.message or "")
    # the same 4k stage on A100 nodes, without the variable: Megatron's own assertion
    rp4 = [stage_job(rp, rp.launchable(["4k"])[0], rotary=False)]
    bare = DeviceFacts("A100, launch env without CUDA_DEVICE_MAX_CONNECTIONS", gpu_arch=(8, 0), env={})
    r = run_preflight(megatron_lm / "pretrain_gpt.py", rp4, bare)
    f = r.stages[0].failure
    assert f is not None and f.name == "validate_args"
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in (f.message or "")


def _fork(tmp_path: Path, megatron_lm: Path) -> Path:
    """A fork stand-in without a copy of Megatron-LM: its megatron/ is a link to the checkout's, and its
    entry script's model class builds RoPE without rotary_base (so the base stays 10000)."""
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "megatron").symlink_to(megatron_lm / "megatron", target_is_directory=True)
    (fork / "pretrain_gpt.py").write_text(
        textwrap.dedent("""\
        from megatron.core.enums import ModelType
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.training import get_args, pretrain
        from megatron.training.arguments import core_transformer_config_from_args


        class FrozenBaseGPT(GPTModel):
            \"\"\"Like the Ermine MDM class: RotaryEmbedding gets no rotary_base.\"\"\"

            def __init__(self, config, spec, args):
                super().__init__(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                                 max_sequence_length=args.max_position_embeddings, position_embedding_type="rope",
                                 rotary_percent=args.rotary_percent)


        def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
            args = get_args()
            config = core_transformer_config_from_args(args)
            spec = get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, normalization=args.normalization)
            return FrozenBaseGPT(config, spec, args)


        if __name__ == "__main__":
            pretrain(None, model_provider, ModelType.encoder_or_decoder, None,
                     args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
        """)
    )
    return fork / "pretrain_gpt.py"


def test_rotary_base_checked_on_the_real_model(megatron_lm: Path, tmp_path: Path) -> None:
    rp = _ermine()
    script = _fork(tmp_path, megatron_lm)
    report = preflight_plan(rp, A100, stages=["8k"], script=script)
    s = report.stages[0]
    assert s.passed() == ["entry-script", "parse_args", "validate_args", "transformer_config"]
    assert s.failure is not None and s.failure.name == "rotary"
    assert "FrozenBaseGPT" in s.failure.detail and "applies RoPE base 10000" in s.failure.detail
    assert "--rotary-base 1300000" in s.failure.detail and "ignores --rotary-base" in s.failure.detail
    with pytest.raises(PreflightError, match="FrozenBaseGPT"):
        require_passed(report)


def test_entry_script_that_parses_first(megatron_lm: Path, tmp_path: Path) -> None:
    """Megatron-LM ≥ 0.19's pretrain_gpt.py calls parse_and_validate_args itself and hands pretrain a config
    container: the preflight takes the parser's inputs from that call and the model provider the script
    imports (model_provider bound to gpt_builder). Stand-in: links to the checkout's files, and an entry
    script of that shape (0.16.1 has no parse_and_validate_args; the recorder stands in for it)."""
    new = tmp_path / "megatron-0.19-style"
    new.mkdir()
    for name in ("megatron", "model_provider.py", "gpt_builders.py"):
        (new / name).symlink_to(megatron_lm / name)
    (new / "pretrain_gpt.py").write_text(
        textwrap.dedent("""\
        from gpt_builders import gpt_builder
        from megatron.training import pretrain
        from megatron.training.arguments import parse_and_validate_args
        from model_provider import model_provider

        if __name__ == "__main__":
            args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
            pretrain({"config": args}, None, None, None)
        """)
    )
    rp = _ermine()
    report = preflight_plan(rp, A100, stages=["8k"], script=new / "pretrain_gpt.py")
    (s,) = report.stages
    assert s.passed() == ["entry-script", "parse_args", "validate_args", "transformer_config", "rotary"], (
        "\n".join(report.lines())
    )
    assert s.model_provider == "model_provider.model_provider(gpt_builders.gpt_builder)"
    assert s.rotary is not None and s.rotary["applied_base"] == pytest.approx(rp.stage("8k").rotary_base)


def test_stage_args_check_cli(megatron_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))
    plan = _tiny_plan(tmp_path, extra='extra_args = ["--no-such-flag"]')
    r = CliRunner().invoke(
        app, ["stage", "args", str(plan), "1k", "--check", "--profile", "generic", "--json"]
    )
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)  # one document, on failure too
    assert doc["argv"][-1] == "--no-such-flag" and doc["preflight"]["ok"] is False
    failure = doc["preflight"]["stages"][0]["failure"]
    assert failure["name"] == "parse_args"
    assert "unrecognized arguments: --no-such-flag" in failure["message"]
    assert doc["preflight"]["facts"]["gpu_arch"] == "8.0"
    assert doc["preflight"]["facts"]["cuda_device_max_connections"] == "1"


def test_profile_facts() -> None:
    leo = preflight_facts(load_profile("leonardo"), gpu_memory_gib=64, environ={})
    assert leo.gpu_arch == (8, 0) and leo.transformer_engine and leo.gpu_name and "A100" in leo.gpu_name
    assert leo.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and leo.env["NCCL_IB_TIMEOUT"] == "120"
    assert any("8.0" in x for x in leo.stand_ins())
    local = preflight_facts(load_profile("local"), environ={})
    assert local.gpu_arch is None and local.transformer_engine is None


def test_preflight_launch_only_checks_megatron_launches() -> None:
    from types import SimpleNamespace

    from longctx.stage.until_done import preflight_launch

    lp = SimpleNamespace(backend="local", argv=["python", "-m", "longctx.train"], env={})
    assert preflight_launch(lp, A100) is None  # type: ignore[arg-type]
    lp = SimpleNamespace(backend="megatron-lm", argv=["python", "/nowhere/pretrain_gpt.py"], env={})
    assert preflight_launch(lp, A100, enabled=False) is None  # type: ignore[arg-type]


def _ermine_mdm() -> ResolvedPlan:
    return resolve_plan(load_plan(REPO / "stages" / "ermine_mdm.toml"))


def test_diffusion_fork_parser_and_rotary_base(
    megatron_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MDM plan names the fork's entry script and flags: upstream's parser refuses those flags, the
    fork's own parser takes them, and the rotary check on the model its class builds refuses the
    reference fork (RotaryEmbedding without rotary_base) and passes a fixed one."""
    rp = _ermine_mdm()
    # upstream pretrain_gpt.py does not know the fork's flags
    up = run_preflight(megatron_lm / "pretrain_gpt.py", [stage_job(rp, rp.stage("8k"))], A100)
    f = up.stages[0].failure
    assert f is not None and f.name == "parse_args", "\n".join(up.lines())
    assert "unrecognized arguments: --padded-input 0 --padded-output 0 --target-length 1" in (f.message or "")
    # the reference fork, through `stage args --check` ($LONGCTX_MEGATRON_LM names the fork's checkout)
    ref = make_mask_diff_fork(tmp_path / "fork", megatron_lm, honours_rotary_base=False)
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(ref))
    r = CliRunner().invoke(
        app, ["stage", "args", str(REPO / "stages" / "ermine_mdm.toml"), "8k", "--check", "--json"]
    )
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert doc["argv"][0] == ENTRY_SCRIPT and doc["preflight"]["script"] == str(ref / ENTRY_SCRIPT)
    (stage,) = doc["preflight"]["stages"]
    assert stage["passed"] == ["entry-script", "parse_args", "validate_args", "transformer_config"]
    assert stage["failure"]["name"] == "rotary" and "MaskedDiffGPT" in stage["failure"]["detail"]
    assert "applies RoPE base 10000" in stage["failure"]["detail"]
    assert "ignores --rotary-base" in stage["failure"]["detail"]
    # the fork whose model class passes --rotary-base: every stage of the plan passes
    fixed = make_mask_diff_fork(tmp_path / "fixed", megatron_lm, honours_rotary_base=True)
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(fixed))
    report = preflight_plan(rp, A100)
    assert report.ok, "\n".join(report.lines())
    for st, s in zip(rp.stages, report.stages, strict=True):
        assert s.rotary is not None and s.rotary["model_class"].endswith("MaskedDiffGPT")
        assert s.rotary["applied_base"] == pytest.approx(st.rotary_base, rel=1e-4)
