"""The 64K stage of baby_9b_dense as it died at start-up on Megatron-LM, scaled down: a tier mix of 9
datasets (3 languages × 3 tiers) whose 1 % validation part holds one window or two of each dataset, its
validation blend asked for one sample (eval_iters 1, global batch 1). megatron-core builds each dataset
for 2 samples and draws 9 by weight, more than 2 from the heaviest (IndexError in
BlendedDataset._build_indices). `plan check --check-data` predicts it; the surplus it suggests mends it;
the real BlendedMegatronDatasetBuilder agrees both ways."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan, open_plan, resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.micro import MicroShapeOptions
from longctx.plan.rehearsal import RehearsalOptions, rehearsal_plan, write_rehearsal_plan
from longctx.plan.split_check import requested_samples
from longctx.plan.stage_data import check_plan_data, require_startable, stage_blend
from longctx.rehearse.run import _checks
from tests.bad_input.harness import refused
from tests.fixtures.artifact import build_artifact
from tests.fixtures.run import ARCH

SEQ = 512
RUN = "lc16k_full_20260507"
# the producer's tiers scaled down (16k_plus: 2 windows of 512 per document); 100 documents per chunk, so the
# 1 % validation part is the last one
TIERS = {"16k_plus": (1030, 1500, 0.5), "4_16k": (200, 520, 0.3), "under4k": (16, 200, 0.2)}
LAYOUT = {(lang, tier): [100] for lang in ("en", "de", "mt") for tier in TIERS}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_artifact(tmp_path_factory.mktemp("nine") / "artifact", run=RUN, layout=LAYOUT, tiers=TIERS)


def write_plan(path: Path, artifact: Path, hf_dir: Path, manifest: Path, extra_args: list[str]) -> Path:
    arch = "\n".join(f"{k} = {v}" for k, v in ARCH.items())
    # a stage's own extra_args replace [defaults]' (where a rehearsal adds its surplus): none unless given
    extra = "extra_args = [" + ", ".join(f'"{a}"' for a in extra_args) + "]" if extra_args else ""
    path.write_text(
        textwrap.dedent(f"""\
        name = "nine"
        run_dir = "{path.parent / "run"}"
        [base]
        path = "${{RUN_DIR}}/base"
        seq_length = 256
        rotary_base = 10000
        [tokenizer]
        path = "{hf_dir}"
        manifest = "{manifest}"
        [megatron]
        version = "0.16.1"
        [model]
        """)
        + arch
        + textwrap.dedent(f"""
        [cluster]
        profile = "local"
        gpus_per_node = 1
        gpu_memory_gib = 8
        [defaults]
        nodes = 1
        tensor_parallel = 1
        context_parallel = 1
        global_batch_size = 1
        eval_interval = 100000000
        eval_iters = 1
        [defaults.data.tier_mix]
        artifact = "{artifact}"
        run = "{RUN}"
        tiers = {{ "16k_plus" = 0.85, "4_16k" = 0.10, "under4k" = 0.05 }}
        alpha = 0.4
        floor = 0.005
        [[stages]]
        name = "64k"
        seq_length = {SEQ}
        tokens = {8 * SEQ}
        rope = {{ base = 100000 }}
        {extra}
        """)
    )
    return path


def _plan(
    tmp_path: Path, artifact: Path, hf_dir: Path, manifest: Path, extra_args: list[str]
) -> ResolvedPlan:
    return resolve_plan(load_plan(write_plan(tmp_path / "plan.toml", artifact, hf_dir, manifest, extra_args)))


def build_real(rp: ResolvedPlan, surplus: float) -> list:
    """megatron-core's builder as longctx/train/data.py calls it, with Megatron-LM's three sizes."""
    st = rp.stages[0]
    blend = stage_blend(rp, st)
    config = GPTDatasetConfig(
        random_seed=st.seed,
        sequence_length=st.seq_length,
        blend=(blend.prefixes, [e.weight for e in blend.entries]),
        split=st.data.split,
        path_to_cache=None,
        tokenizer=SimpleNamespace(eod=2, pad=-1, vocab_size=512, unique_identifiers={"class": "test"}),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
        mid_level_dataset_surplus=surplus,
    )
    sizes = [n for n, _ in requested_samples(st, "megatron-lm")]
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def _suggested(fix: str) -> float:
    found = re.search(r'"--mid-level-dataset-surplus", "([0-9.]+)"', fix)
    assert found, fix
    return float(found.group(1))


def test_the_nine_dataset_validation_blend_is_refused_naming_the_dataset(
    tmp_path: Path, artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    plan = write_plan(tmp_path / "plan.toml", artifact, oellm_like_hf_dir, oellm_like_manifest, [])
    text = refused(["plan", "check", plan, "--check-data"], [tmp_path, artifact], needle="blend-oversampled")
    assert "The valid blend oversamples the contributing datasets" in text, text
    assert re.search(r"draws 3 samples of 512 tokens from lc16k_full_20260507_\w+_text_document", text), text
    assert "which makes 2, built for 2" in text and "--mid-level-dataset-surplus" in text, text
    rp = resolve_plan(load_plan(plan))
    finding = next(f for r in check_plan_data(rp, scan=False).values() for f in r.findings.errors)
    assert finding.code == "blend-oversampled" and finding.where in stage_blend(rp, rp.stages[0]).prefixes
    # the launch's guard refuses it on Megatron-LM; the local trainer builds the train part only
    with pytest.raises(StageError, match="oversamples"):
        require_startable(rp, rp.stages[0], "megatron-lm")
    require_startable(rp, rp.stages[0], "local")
    # and megatron-core's real builder stops exactly so
    with pytest.raises(IndexError, match=r"The valid blend oversamples.*requests 3 samples .* of its size 2"):
        build_real(rp, 0.005)


def test_the_suggested_surplus_passes_the_check_and_the_real_builder(
    tmp_path: Path, artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    rp = _plan(tmp_path, artifact, oellm_like_hf_dir, oellm_like_manifest, [])
    fix = next(f for r in check_plan_data(rp, scan=False).values() for f in r.findings.errors).fix or ""
    surplus = _suggested(fix)
    mended = _plan(
        tmp_path,
        artifact,
        oellm_like_hf_dir,
        oellm_like_manifest,
        ["--mid-level-dataset-surplus", str(surplus)],
    )
    assert not [f for r in check_plan_data(mended, scan=False).values() for f in r.findings.errors]
    require_startable(mended, mended.stages[0], "megatron-lm")
    train, valid, _ = build_real(mended, surplus)
    assert len(valid) == 9 and len(train) >= 8
    assert np.bincount(valid.dataset_index).max() == 3
    # one step below the suggestion megatron-core still refuses: it is the smallest that works
    with pytest.raises(IndexError, match="oversamples"):
        build_real(mended, round(surplus - 0.01, 6))


@pytest.mark.parametrize("backend", ["megatron-lm", "local"])
@pytest.mark.parametrize("stage_args", [[], ["--log-throughput"]], ids=["defaults", "stage-args"])
def test_the_rehearsal_of_the_plan_passes_on_either_backend(
    tmp_path: Path,
    artifact: Path,
    oellm_like_hf_dir: Path,
    oellm_like_manifest: Path,
    backend: str,
    stage_args: list[str],
) -> None:
    """longctx/plan/rehearsal.py gives a Megatron-LM rehearsal (batch 1) a surplus of the blend's dataset
    count, also to a stage with extra_args of its own (they replace [defaults]'); a local one builds the
    train part only (its plan's [slurm] says which backend trains)."""
    rp = _plan(tmp_path, artifact, oellm_like_hf_dir, oellm_like_manifest, stage_args)
    opts = RehearsalOptions(
        shape=MicroShapeOptions(layers=1),
        iterations=3,
        tokenizer=oellm_like_hf_dir,
        manifest=oellm_like_manifest,
        backend=backend,
    )
    run_dir = tmp_path / f"rehearsal-{backend}"
    plan = write_rehearsal_plan(rehearsal_plan(rp, run_dir, opts), tmp_path / f"rehearsal-{backend}.toml")
    rehearsal = open_plan(plan, run_dir)
    assert ("--mid-level-dataset-surplus" in rehearsal.stages[0].extra_args) == (backend == "megatron-lm")
    assert set(stage_args) <= set(rehearsal.stages[0].extra_args)
    assert not [f for r in check_plan_data(rehearsal, scan=False).values() for f in r.findings.errors]


def test_longctx_rehearse_refuses_it_in_its_checks(
    tmp_path: Path, artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path
) -> None:
    rp = _plan(tmp_path, artifact, oellm_like_hf_dir, oellm_like_manifest, [])
    said: list[str] = []
    with pytest.raises(StageError, match="The valid blend oversamples") as err:
        _checks(rp, said.append)
    assert "--mid-level-dataset-surplus" in (err.value.fix or "") and not said


@pytest.mark.parametrize("value", ["-1", "nan", "lots"])
def test_a_surplus_megatron_cannot_use_is_refused(
    tmp_path: Path, artifact: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, value: str
) -> None:
    extra = [f"--mid-level-dataset-surplus={value}"]
    plan = write_plan(tmp_path / "plan.toml", artifact, oellm_like_hf_dir, oellm_like_manifest, extra)
    text = refused(["plan", "check", plan, "--check-data"], [tmp_path, artifact], needle="blend-surplus")
    assert "is not a number >= 0" in text, text
