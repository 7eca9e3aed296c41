"""Diffusion-model evaluation: passkey by infilling and the ELBO by context — with oracle infillers whose
answers are known, then through megatron-core on real MDM and UDM-MoE saves."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from longctx.eval.data import HeldOut
from longctx.eval.engine import CheckpointRef, evaluate_checkpoints, write_outputs
from longctx.eval.grid import PasskeyGrid
from longctx.eval.infill import context_elbo, elbo_contexts, key_positions, model_infiller, score_infill
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.settings import EvalSettings
from longctx.mcore.parallel import eval_parallel
from longctx.objective import Objective
from longctx.tokenizer import load_tokenizer
from longctx.util.net import free_port
from tests.fixtures.diffusion import VOCAB

MASK = 600


def _grid(tiny_run: Path) -> tuple[PasskeyGrid, int]:
    tok = load_tokenizer(tiny_run / "tokenizer")
    return PasskeyGrid(tok, distractors=3), tok.vocab_size


@pytest.mark.parametrize("kind", ["mdm", "udm"])
def test_passkey_by_infilling_masks_only_the_restated_key(tiny_run: Path, kind: str) -> None:
    grid, vocab = _grid(tiny_run)
    items = [grid.item(256, d, i, closed=True) for d in (0.0, 0.5, 1.0) for i in range(2)]
    seen: list[torch.Tensor] = []
    for right in (True, False):
        scores = score_infill(
            items,
            _per_item_oracle(items, vocab, right, seen),
            kind=kind,
            mask_id=MASK if kind == "mdm" else None,
            vocab_size=vocab,
            seed=1,
            threshold=0.9,
            batch_size=4,
        )
        assert all(s.greedy == right and (s.loglik is right) for s in scores)
        assert all((s.digit_accuracy == 1.0) == right for s in scores)
    rows = torch.cat(seen)[: len(items)]
    for it, row in zip(items, rows, strict=True):
        a, b = it.answer_start, it.answer_end
        assert row[:a].tolist() == it.prompt, "the haystack and the question stay clean"
        assert it.closing and row[b:].tolist() == it.closing, "the restatement's closing stays clean"
        keys = key_positions(it)
        assert keys and all(it.digit_mask[p - a] for p in keys)
        kept = [p for p in range(a, b) if p not in keys]  # the space before the key, where it is a token
        assert [int(row[p]) for p in kept] == [it.answer[p - a] for p in kept]
        if kind == "mdm":
            assert [int(row[p]) for p in keys] == [MASK] * len(keys)
        else:
            assert [int(row[p]) for p in keys] != [it.answer[p - a] for p in keys] and int(row.max()) < vocab


def test_a_closed_restatement_ends_as_the_needle_does(tiny_run: Path) -> None:
    """Infilling items close the restatement with the rest of the needle's sentence, inside the same
    length; the needle and the depth arithmetic are those of the open item."""
    grid, _ = _grid(tiny_run)
    for depth in (0.0, 0.5, 1.0):
        open_, closed = grid.item(512, depth, 3), grid.item(512, depth, 3, closed=True)
        assert len(closed.tokens) == len(open_.tokens) == 512 and not open_.closing
        assert closed.needle == open_.needle and closed.answer == open_.answer
        assert closed.needle[-len(closed.closing) :] == closed.closing
        assert closed.tokens[closed.answer_end :] == closed.closing
        start = closed.needle_start
        assert closed.tokens[start : start + len(closed.needle)] == closed.needle


def _per_item_oracle(items, vocab: int, right: bool, seen: list[torch.Tensor]):
    def infill(tokens: torch.Tensor, positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        seen.append(tokens.clone())
        out = []
        for row, want in zip(tokens, positions, strict=True):
            it = next(it for it in items if row[: it.answer_start].tolist() == it.prompt)
            lp = torch.full((len(want), vocab), -20.0)
            for j, p in enumerate(want.tolist()):
                tok = it.answer[p - it.answer_start]
                lp[j, tok if right else (tok + 1) % vocab] = 0.0
            out.append(lp.log_softmax(-1))
        return out

    return infill


def test_elbo_by_context_reads_the_context_and_repeats_exactly() -> None:
    """An oracle that is surer of the window's clean tokens the more context it is given: the bound
    falls with the context, and the same document gives the same numbers (fixed mask draws)."""
    vocab, window = 50, 16
    doc = (np.arange(300) * 7) % vocab
    obj = Objective(kind="mdm", mask_id=vocab)
    mid = len(doc) // 2

    def infill(tokens: torch.Tensor, positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for row, want in zip(tokens, positions, strict=True):
            c = len(row) - window
            start = mid - window // 2 - c // 2
            lp = torch.zeros(len(want), vocab)
            for j, p in enumerate(want.tolist()):
                assert row[p] == vocab or int(row[p]) == int(doc[start + p]), "window tokens: clean or masked"
                lp[j, int(doc[start + p])] = c / 32.0
            out.append(lp.log_softmax(-1))
        return out

    contexts = elbo_contexts(300, window)
    assert contexts == [0, 16, 64, 256, 272]
    kw = dict(
        objective=obj, vocab_size=vocab, window=window, contexts=contexts, t_levels=[0.25, 0.75], seed=3
    )
    one = context_elbo([doc], infill, **kw)
    assert one == context_elbo([doc], infill, **kw)
    assert all(a > b for a, b in zip(one.elbo, one.elbo[1:], strict=False)), one.elbo
    # no context: the oracle guesses uniformly, CE = log V at each masked token, weighted by 1/t
    assert 0 < one.elbo_by_t[0][0] <= np.log(vocab) / 0.25 + 1e-9


@pytest.mark.parametrize("name", ["mdm", "udm_moe"])
def test_a_diffusion_checkpoint_is_evaluated_by_infilling(
    tiny_run: Path, diffusion_checkpoints: Path, tmp_path: Path, name: str
) -> None:
    ckpt = diffusion_checkpoints / name
    info = checkpoint_info(ckpt)
    assert info.objective == ("mdm" if name == "mdm" else "udm")
    tok = load_tokenizer(tiny_run / "tokenizer")
    heldout = HeldOut([str(tiny_run / "data" / "corpus_text_document")], "98,2,0")
    settings = EvalSettings(
        depths=[0.0, 1.0], keys_per_cell=1, loss_docs=1, elbo_window=32, elbo_levels=[0.2, 0.7]
    )
    refs = [CheckpointRef(label=name, path=ckpt, allow_extrapolation=True)]
    kw = dict(lengths=[128], tokenizer=tok, heldout=heldout, settings=settings, short_length=64)
    report = evaluate_checkpoints(refs, **kw)
    (result,) = report.checkpoints[0].results
    assert result.objective == info.objective and result.position is None
    assert result.passkey.keys == 2
    elbo = result.context_elbo
    assert elbo is not None and elbo.contexts == [0, 32, 96] and elbo.documents == 1
    assert all(np.isfinite(elbo.elbo)) and all(x > 0 for x in elbo.elbo)
    assert report.checkpoints[0].short is None
    assert any("infilling" in n for n in report.notes)
    # fixed draws: a second evaluation gives the same numbers
    again = evaluate_checkpoints(refs, **kw).checkpoints[0].results[0]
    assert again.context_elbo == elbo and again.passkey.loglik_margin == result.passkey.loglik_margin
    out = write_outputs(report, tmp_path / "eval")
    assert set(out.plots) == {"niah", "elbo_by_context"}
    assert all(Path(p).stat().st_size > 1000 for p in out.plots.values())
    saved = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert saved["checkpoints"][0]["results"][0]["context_elbo"]["contexts"] == [0, 32, 96]


def _infill_worker(rank: int, world: int, port: int, ckpt: str, tokens: np.ndarray, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    with eval_parallel(world) as par:
        infill = model_infiller(load_model(checkpoint_info(ckpt), par, max_length=tokens.shape[1]), VOCAB)
        want = [torch.arange(tokens.shape[1])] * len(tokens)
        got = infill(torch.from_numpy(tokens), want)
    np.save(f"{out}.{rank}.npy", torch.stack(got).numpy())


def test_context_parallel_infilling_matches_a_single_process(
    diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    """Bidirectional attention through the non-causal ring: every position's log-probs at CP 2 equal CP 1."""
    import torch.multiprocessing as mp

    ckpt = diffusion_checkpoints / "mdm"
    tokens = torch.randint(0, VOCAB + 1, (2, 64), generator=torch.Generator().manual_seed(0)).numpy()
    with eval_parallel(1) as par:
        infill = model_infiller(load_model(checkpoint_info(ckpt), par, max_length=64), VOCAB)
        ref = torch.stack(infill(torch.from_numpy(tokens), [torch.arange(64)] * 2)).numpy()
    out = str(tmp_path / "cp")
    mp.start_processes(
        _infill_worker, args=(2, free_port(), str(ckpt), tokens, out), nprocs=2, start_method="spawn"
    )
    for rank in range(2):
        np.testing.assert_allclose(np.load(f"{out}.{rank}.npy"), ref, atol=1e-4)
