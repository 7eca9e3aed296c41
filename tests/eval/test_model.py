"""Checkpoints → megatron-core GPTModel → scores: a model whose answer is known, CP = 2 against
CP = 1, and clear errors for checkpoints that cannot be evaluated."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from longctx.errors import EvalError, ParallelError
from longctx.eval.grid import PasskeyGrid
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.runner import check_length, check_tokenizer
from longctx.eval.score import model_scorer, score_passkey
from longctx.mcore.parallel import eval_parallel
from longctx.util.net import free_port
from tests.fixtures.eval import CHAIN_KEY, CHAIN_LEN, PADDED, S2_LEN, EvalRun


def test_checkpoint_info_from_saved_args(eval_run: EvalRun) -> None:
    info = checkpoint_info(eval_run.stage("s2"))
    assert info.iteration == 3 and Path(info.path).name == "iter_0000003"
    assert info.rotary_base == 40000 and info.rotary_base_source == "args"
    assert info.max_position == S2_LEN and info.padded_vocab_size == PADDED
    assert info.arch.num_layers == 2 and info.arch.hidden_size == 64 and info.arch.query_groups == 2
    assert info.stage == "s2"
    assert checkpoint_info(eval_run.stage("s2"), rotary_base=123).rotary_base == 123
    # an iteration directory resolves to itself; the identity tracks the contents
    assert checkpoint_info(Path(info.path)).identity == info.identity
    assert checkpoint_info(eval_run.stage("s1")).identity != info.identity


def test_known_answer_model_through_megatron(eval_run: EvalRun, demo_tokenizer: Any) -> None:
    """The chain checkpoint continues every passkey question with CHAIN_KEY, whatever the context."""
    from longctx.tokenizer import load_tokenizer

    tok = load_tokenizer(eval_run.tokenizer)
    grid = PasskeyGrid(tok, distractors=3)
    # keys written digit by digit, as the chain model's answer is: distractors of the same form
    others = ["4 4 4 4 4", "1 2 1 2 1", "5 6 7 8 9"]
    right = [
        grid.item(CHAIN_LEN, d, i, key=CHAIN_KEY, distractor_keys=others)
        for d in (0.0, 0.5, 1.0)
        for i in range(2)
    ]
    wrong = [
        grid.item(CHAIN_LEN, d, key="1 2 1 2 1", distractor_keys=["4 4 4 4 4", CHAIN_KEY]) for d in (0.0, 1.0)
    ]
    info = checkpoint_info(eval_run.chain)
    with eval_parallel(1) as par:
        score = model_scorer(load_model(info, par, max_length=CHAIN_LEN))
        got_right = score_passkey(right, score, batch_size=4)
        got_wrong = score_passkey(wrong, score, batch_size=3)
    for it, s in zip(right, got_right, strict=True):
        assert s.greedy and s.digit_accuracy == 1.0 and s.greedy_tokens == it.answer
        assert s.loglik and s.loglik_margin is not None and s.loglik_margin > 10
        assert s.logprob > -0.1 * len(it.answer)
    for s in got_wrong:
        assert not s.greedy and not s.loglik
        assert s.loglik_margin is not None and s.loglik_margin < -10  # CHAIN_KEY, a distractor, wins
        # teacher forced on the wrong key, the first answer position still predicts the chain's start
        assert s.greedy_tokens[0] == right[0].answer[0]


def _cp_worker(rank: int, world: int, port: int, ckpt: str, tokens: np.ndarray, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    with eval_parallel(world) as par:
        loaded = load_model(checkpoint_info(ckpt), par, max_length=tokens.shape[1])
        res = model_scorer(loaded)(torch.from_numpy(tokens))
    np.savez(f"{out}.{rank}.npz", logprob=res.logprob, argmax=res.argmax, margin=res.margin)


@pytest.mark.slow
def test_context_parallel_scores_match_a_single_process(eval_run: EvalRun, tmp_path: Path) -> None:
    """Each CP rank scores its zigzag shard through the ring; gathered, it equals CP = 1."""
    import torch.multiprocessing as mp

    from longctx.eval.data import HeldOut

    docs, _ = HeldOut([str(eval_run.data_prefix)], "90,10,0").long_documents(S2_LEN, 2)
    tokens = np.stack(docs)
    with eval_parallel(1) as par:
        ref = model_scorer(load_model(checkpoint_info(eval_run.stage("s2")), par, max_length=S2_LEN))(
            torch.from_numpy(tokens)
        )
    out = str(tmp_path / "cp")
    mp.start_processes(
        _cp_worker,
        args=(2, free_port(), str(eval_run.stage("s2")), tokens, out),
        nprocs=2,
        start_method="spawn",
    )
    for rank in range(2):
        got = np.load(f"{out}.{rank}.npz")
        np.testing.assert_allclose(got["logprob"], ref.logprob, atol=1e-4)
        np.testing.assert_allclose(got["margin"], ref.margin, atol=1e-4)
        assert (got["argmax"] == ref.argmax).mean() > 0.999  # near-ties may flip


# -- bad inputs ------------------------------------------------------------------------------------


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(EvalError) as err:
        checkpoint_info(tmp_path / "nope")
    assert err.value.what == "checkpoint not found"
    assert "save dir" in (err.value.fix or "")


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError) as err:
        checkpoint_info(tmp_path / "empty")
    assert err.value.what.startswith("cannot read the checkpoint: no torch_dist checkpoint here")


def test_tracker_pointing_nowhere(eval_run: EvalRun, tmp_path: Path) -> None:
    save = tmp_path / "save"
    shutil.copytree(eval_run.stage("s1"), save)
    (save / "latest_checkpointed_iteration.txt").write_text("9\n")
    with pytest.raises(EvalError) as err:
        checkpoint_info(save)
    assert "the tracker names iter_0000009, which does not exist" in err.value.what
    assert "newest complete iteration is 3" in (err.value.fix or "")


def test_length_checks(eval_run: EvalRun) -> None:
    info = checkpoint_info(eval_run.stage("s1"))  # trained at 128
    assert check_length(info, 128, allow_extrapolation=False, cp=1) is False
    with pytest.raises(EvalError) as err:
        check_length(info, 256, allow_extrapolation=False, cp=1)
    assert err.value.what == "length 256 is above the checkpoint's max position 128 (its trained window)"
    assert "--extrapolate" in (err.value.fix or "")
    assert check_length(info, 256, allow_extrapolation=True, cp=1) is True
    with pytest.raises(EvalError) as err:
        check_length(info, 126, allow_extrapolation=False, cp=2)
    assert err.value.what == "length 126 does not split into 2·CP = 4 equal chunks (CP = 2)"


def test_tokenizer_mismatch(eval_run: EvalRun, gpt2_like_dir: Path) -> None:
    from longctx.tokenizer import load_tokenizer

    info = checkpoint_info(eval_run.stage("s1"))
    check_tokenizer(info, load_tokenizer(eval_run.tokenizer))
    with pytest.raises(EvalError) as err:
        check_tokenizer(info, load_tokenizer(gpt2_like_dir))
    assert "is not the one the checkpoint was trained with" in err.value.what


def test_world_must_equal_cp() -> None:
    with pytest.raises(ParallelError) as err, eval_parallel(2):
        pass
    assert err.value.what == "evaluation with CP = 2 needs exactly 2 process(es); this world has 1"
    # nothing is left behind: a fresh evaluation can still start
    with eval_parallel(1) as par:
        assert par.cp == 1


def test_checkpoints_of_other_layouts_and_eras(megatron_checkpoints: Any, tmp_path: Path) -> None:
    """TP = 2 bf16 (resharded to TP 1), tied embeddings with LayerNorm/GELU, and the megatron-core
    ≥ 0.19 layout (common state inside the DCP shards, no common.pt) all load and score."""
    import argparse

    from longctx.checkpoint.inspect import inspect_checkpoint

    tokens = torch.randint(3, 200, (2, 64), generator=torch.Generator().manual_seed(0))
    # the ≥ 0.19 checkpoint with a common.pt put back: megatron-core 0.16's own loader reads that one
    era = megatron_checkpoints.iter_dir("era019")
    restored = tmp_path / era.name
    shutil.copytree(era, restored)
    plain = {
        k: v
        for k, v in inspect_checkpoint(era).args.items()
        if isinstance(v, int | float | str | bool | None)
    }
    torch.save(
        {"args": argparse.Namespace(**plain), "checkpoint_version": 3.0, "iteration": 6},
        restored / "common.pt",
    )
    got = {}
    with eval_parallel(1) as par:
        for name, path in [
            *((n, megatron_checkpoints.save_dir(n)) for n in ("gqa", "tp2", "tied", "era019")),
            ("restored", restored),
        ]:
            res = model_scorer(load_model(checkpoint_info(path), par, max_length=64))(tokens)
            assert np.isfinite(res.logprob).all() and res.logprob.shape == (2, 63)
            got[name] = res.logprob
    assert checkpoint_info(megatron_checkpoints.save_dir("tp2")).padded_vocab_size == 768
    np.testing.assert_allclose(got["era019"], got["restored"], atol=1e-6)
    assert not np.allclose(got["era019"], got["gqa"])  # different weights, same architecture
