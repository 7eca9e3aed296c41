"""Each family's stored layout, shipped the way Ermine ships it (a model-only save inside `.tar` or
`.tar.tar`), adopted, trained one stage by `stage run` and saved back in that layout: the same tensor
names and shapes, the `subtokenizer.*` buffers unchanged, the weights trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longctx.checkpoint import inspect_checkpoint
from longctx.checkpoint.adopt import adopt
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from tests.fixtures.diffusion import VOCAB, diffusion_plan
from tests.train.helpers import run_first_stage, saved_tensors

MODEL = ("encoder.", "decoder.", "embedding.", "output_layer.", "subtokenizer.")


def _model_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    index = inspect_checkpoint(ckpt).index
    assert index is not None
    return {k: tuple(t.shape) for k, t in index.tensors.items() if k.startswith(MODEL)}


@pytest.mark.parametrize(
    ("name", "archive", "objective"),
    [
        # encoder., one tied embedding with the [MASK] row: its logit is an output row too
        ("mdm_tied", ".tar", f'kind = "mdm"\noutput_rows = {VOCAB + 1}'),
        ("mdm_gpt", ".tar.tar", 'kind = "mdm"'),  # decoder., untied, [MASK] row, no buffers
        ("arm_unpadded", ".tar.tar", f'kind = "ar"\ninput_rows = {VOCAB}'),  # decoder., tied, unpadded
    ],
)
def test_adopted_layout_trains_and_is_saved_back(
    fresh_run: Path,
    diffusion_archives: dict[str, Path],
    tmp_path: Path,
    name: str,
    archive: str,
    objective: str,
) -> None:
    src = diffusion_archives[name if archive == ".tar" else f"{name}.tar.tar"]
    result = adopt(src, tmp_path / "base")
    assert result.verify is not None and result.verify.ok
    base = inspect_checkpoint(tmp_path / "base")
    base_iter = tmp_path / "base" / "iter_0000001"
    # two iterations, one save: what is checked is the layout of the stage's save
    plan = diffusion_plan(tmp_path, fresh_run, tmp_path / "base", objective, s1_tokens=2 * 4 * 128)
    rp = resolve_plan(load_plan(plan))
    saved = run_first_stage(plan, rp)
    after = inspect_checkpoint(saved)
    assert after.family.label == base.family.label and after.family.block == base.family.block
    assert _model_shapes(saved) == _model_shapes(base_iter)
    before_t = saved_tensors(base_iter, prefixes=MODEL)
    after_t = saved_tensors(saved, prefixes=MODEL)
    buffers = [k for k in before_t if k.startswith("subtokenizer.")]
    assert bool(buffers) == (name == "mdm_tied")
    assert all(torch.equal(before_t[k], after_t[k]) for k in buffers)
    trained = [k for k in before_t if k not in buffers and not torch.equal(before_t[k], after_t[k])]
    assert len(trained) >= len(before_t) - len(buffers) - 2, "the layers and embeddings were trained"
