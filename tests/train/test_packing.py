"""Packed documents on the local backend: boundaries from EOD tokens as Megatron derives them, and a
GPTModel trained within documents at CP = 2 equal to CP = 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

from longctx.attention.megatron_adapter import eod_document_bounds
from longctx.train.data import build_train_dataset, document_positions, micro_batch
from tests.attention.document_cases import document_mask
from tests.fixtures.diffusion import VOCAB
from tests.train.helpers import run, spec

EOD = 7


def test_boundaries_and_positions_are_megatrons():
    """Boundaries after every EOD (none twice at a sample edge), positions reset like Megatron's
    --reset-position-ids, and the block-diagonal causal mask equal to its --reset-attention-mask."""
    tokens = torch.tensor([[1, 2, EOD, 3, EOD, EOD, 4, 5, 6, EOD], [EOD, 1, 2, 3, 4, 5, 6, 7 - 6, 2, 3]])
    cu = eod_document_bounds(tokens, EOD)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 3, 5, 6, 10, 11, 20]
    positions = document_positions(cu, 2, 10)
    for i in range(2):
        mask, _, theirs = _get_ltor_masks_and_position_ids(tokens[i], EOD, True, True, False, True)
        assert torch.equal(positions[i], theirs)
        bounds = [x - 10 * i for x in cu.tolist() if 10 * i <= x <= 10 * (i + 1)]
        assert torch.equal(~mask[0], document_mask(bounds, 10, causal=True))  # Megatron: True = masked


def _losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "reset", "split", "cp"),
    [("gpt", True, "balanced", 2), ("mdm", False, "auto", 2), ("gpt", True, "zigzag", 4)],
)
def test_cp_within_documents_matches_cp1(
    fresh_run: Path, tmp_path: Path, kind: str, reset: bool, split: str, cp: int
) -> None:
    """Causal and bidirectional objectives, the shards cut at CP 2 by the document-balanced split, or by
    the split the cost model chooses (zigzag for windows this short: the balance saves less than the calls
    cost); and at CP 4, the demo's 16K stage's, by the zigzag split (eight chunks, four rank boundaries)."""
    from longctx.objective import Objective

    objective = Objective(kind="mdm", mask_id=VOCAB) if kind == "mdm" else Objective()
    kw = dict(
        seq_length=256,
        max_position_embeddings=256,
        rotary_base=50000,
        train_iters=2,
        global_batch_size=2,
        micro_batch_size=2,
        save_interval=2,
        packing="documents",
        reset_position_ids=reset,
        objective=objective,
    )
    one, two = tmp_path / "cp1" / "ckpt", tmp_path / "cp2" / "ckpt"
    s1 = spec(fresh_run, one, **kw)
    # the windows really are stitched from several documents
    batch = micro_batch(build_train_dataset(s1), list(range(4)), 0, 1, documents_eod=s1.tokenizer.eod_id)
    assert batch.cu_seqlens is not None and len(batch.cu_seqlens) > 5, batch.cu_seqlens
    run(s1, tmp_path / "cp1.json")
    run(spec(fresh_run, two, context_parallel=cp, cp_split=split, **kw), tmp_path / "cp2.json", nproc=cp)
    l1, l2 = _losses(one.parent / "metrics.jsonl"), _losses(two.parent / "metrics.jsonl")
    assert len(l1) == len(l2) == 2
    assert l1 == pytest.approx(l2, rel=1e-6, abs=1e-6)
    print(kind, "cp1", l1, f"cp{cp}", l2, "max diff", max(abs(a - b) for a, b in zip(l1, l2, strict=True)))


def test_diffusion_noise_never_moves_a_document_bound(fresh_run: Path) -> None:
    """Under a diffusion objective the EODs are corrupted like any token (masked, or drawn over), but the
    documents' bounds and positions are the clean data's."""
    from longctx.objective import Objective
    from longctx.train.data import NoiseSource

    s = spec(
        fresh_run,
        fresh_run / "unused",
        seq_length=128,
        max_position_embeddings=128,
        global_batch_size=32,
        packing="documents",
        reset_position_ids=True,
    )
    ds, eod, idx = build_train_dataset(s), s.tokenizer.eod_id, list(range(32))
    for obj in (Objective(kind="mdm", mask_id=s.tokenizer.vocab_size), Objective(kind="udm")):
        noise = NoiseSource(obj, seed=3, global_batch_size=32, vocab_size=s.tokenizer.vocab_size)
        noisy = micro_batch(ds, idx, 0, 1, documents_eod=eod, reset_position_ids=True, noise=noise)
        assert ((noisy.labels == eod) & (noisy.tokens != eod)).any()  # some EOD was corrupted
        # the diffusion models' sequence is the clean labels (no shift): their EODs end the documents
        assert torch.equal(noisy.cu_seqlens, eod_document_bounds(noisy.labels, eod))
        assert torch.equal(noisy.position_ids, document_positions(noisy.cu_seqlens, *noisy.labels.shape))
