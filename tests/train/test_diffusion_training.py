"""The diffusion objectives in the local trainer: CP 2 trains like CP 1 (bidirectional ring attention,
noise drawn over the full sequence), and a masked-diffusion model stored in the BERT-derived
`encoder.` layout trains through a plan's stages and is saved back in that layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from longctx.checkpoint import inspect_checkpoint
from longctx.checkpoint.save_layout import read_tracker
from longctx.cli.main import app
from longctx.objective import Objective
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.paths import stage_dir
from longctx.train.spec import TrainSpec
from tests.fixtures.diffusion import VOCAB, diffusion_plan
from tests.train.helpers import run, run_first_stage, saved_tensors, spec

# two iterations a stage, one save each: the layout checks read the stage's save, not how long it trained
SHORT_STAGES = dict(s1_tokens=2 * 4 * 128, s2_tokens=2 * 2 * 256)


def _losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.parametrize("kind", ["mdm", "udm"])
def test_cp2_matches_cp1(fresh_run: Path, tmp_path: Path, kind: str) -> None:
    objective = Objective(kind=kind, mask_id=VOCAB if kind == "mdm" else None)
    kw = dict(
        seq_length=256,
        max_position_embeddings=256,
        train_iters=3,
        global_batch_size=2,
        save_interval=3,
        objective=objective,
    )
    one, two = tmp_path / "cp1" / "ckpt", tmp_path / "cp2" / "ckpt"
    run(spec(fresh_run, one, **kw), tmp_path / "cp1.json")
    run(spec(fresh_run, two, context_parallel=2, **kw), tmp_path / "cp2.json", nproc=2)
    l1, l2 = _losses(one.parent / "metrics.jsonl"), _losses(two.parent / "metrics.jsonl")
    assert len(l1) == len(l2) == 3 and all(x > 0 for x in l1)
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-5)
    a, b = saved_tensors(one / "iter_0000003"), saved_tensors(two / "iter_0000003")
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-4 * max(1.0, float(a[k].abs().max())), k
    assert inspect_checkpoint(one / "iter_0000003").args["longctx_objective"] == kind


def _buffers(iter_dir: Path) -> dict[str, torch.Tensor]:
    return saved_tensors(iter_dir, prefixes=("subtokenizer.",))


def _assert_encoder_layout(save: Path, base_buffers: dict[str, torch.Tensor]) -> None:
    tracker = read_tracker(save)
    assert tracker is not None
    ckpt = save / tracker.dir_name
    report = inspect_checkpoint(ckpt)
    fam = report.family
    assert (fam.family, fam.block, fam.mask_id) == ("MDM", "encoder", VOCAB)
    assert (fam.input_vocab_rows, fam.output_vocab_rows) == (VOCAB + 1, VOCAB)
    assert not saved_tensors(ckpt, prefixes=("decoder.",))
    assert saved_tensors(ckpt, prefixes=("encoder.layers.",))
    got = _buffers(ckpt)
    assert got.keys() == base_buffers.keys()
    assert all(torch.equal(got[k], base_buffers[k]) for k in got)


def test_encoder_checkpoint_trains_through_stages_and_keeps_its_layout(
    fresh_run: Path, diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    base = diffusion_checkpoints / "mdm"
    base_buffers = _buffers(base / "iter_0000001")
    assert set(base_buffers) == {"subtokenizer.mask", "subtokenizer.lookup_table"}
    plan = diffusion_plan(tmp_path, fresh_run, base, 'kind = "mdm"', **SHORT_STAGES)
    rp = resolve_plan(load_plan(plan))
    runner = CliRunner()
    # s1 from the encoder base (weights only), then s2 at CP 2 with the bidirectional ring
    for stage in rp.stages:
        res = runner.invoke(app, ["stage", "run", str(plan), "--no-eval"])
        assert res.exit_code == 0, res.output
        _assert_encoder_layout(stage.save_dir, base_buffers)
    s2 = rp.stages[1]
    assert s2.cp == 2
    # a resume reads the layout of its own save: two more iterations of s2
    spec_path = stage_dir(rp.plan, s2.name) / "train_spec.json"
    more = TrainSpec.read(spec_path).model_copy(update={"train_iters": s2.train_iters + 2})
    assert more.objective.kind == "mdm" and more.output_vocab_size == VOCAB
    run(more, tmp_path / "more.json", nproc=2)
    tracker = read_tracker(s2.save_dir)
    assert tracker is not None and tracker.iteration == s2.train_iters + 2
    _assert_encoder_layout(s2.save_dir, base_buffers)


def test_uniform_state_moe_trains_from_its_stacked_expert_checkpoint(
    fresh_run: Path, diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    """UDM-MoE (encoder layout, experts stacked, no [MASK] row): forward and backward of the MoE FFN on
    CPU (EP 1), saved back with its router and expert tensors under `encoder.`."""
    base = diffusion_checkpoints / "udm_moe"
    plan = diffusion_plan(tmp_path, fresh_run, base, 'kind = "udm"', **SHORT_STAGES)
    rp = resolve_plan(load_plan(plan))
    assert rp.arch.num_experts == 4 and rp.stages[0].padded_vocab_size == VOCAB
    ckpt = run_first_stage(plan, rp)
    s1 = rp.stages[0]
    fam = inspect_checkpoint(ckpt).family
    assert (fam.family, fam.moe, fam.block, fam.expert_layout) == ("UDM", True, "encoder", "stacked")
    before = {
        k: v for k, v in saved_tensors(base / "iter_0000001", prefixes=("encoder.",)).items() if ".mlp." in k
    }
    after = {k: v for k, v in saved_tensors(ckpt, prefixes=("encoder.",)).items() if ".mlp." in k}
    assert before.keys() == after.keys()
    assert any(".router." in k for k in after) and any(".experts." in k for k in after)
    assert all(not torch.equal(before[k], after[k]) for k in after), (
        "every expert and the router were trained"
    )
    losses = _losses(stage_dir(rp.plan, s1.name) / "metrics.jsonl")
    assert len(losses) == s1.train_iters and all(x > 0 for x in losses)
