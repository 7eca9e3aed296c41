"""A model exported from the last stage of a small demo-like ladder scores the same passkey results in
transformers as in longctx's own evaluation (megatron-core): the same grid, the same scoring, item by
item. The known-answer checkpoint of the eval fixtures, exported too, retrieves its key in both (and
in transformers' own `generate`), so the agreement is not only at chance level."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longctx.eval.grid import PasskeyGrid
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.results import PasskeyResult
from longctx.eval.runner import evaluate_path
from longctx.eval.score import model_scorer, score_passkey
from longctx.eval.settings import EvalSettings
from longctx.export import export_hf
from longctx.mcore.parallel import eval_parallel
from longctx.tokenizer import load_tokenizer
from tests.export import hf
from tests.fixtures.eval import CHAIN_KEY, CHAIN_LEN, S2_LEN, EvalRun

SETTINGS = EvalSettings(depths=[0.0, 0.5, 1.0], keys_per_cell=2, distractors=2, short_docs=0, loss_docs=1)


def test_last_stage_scores_the_same_in_transformers(eval_run: EvalRun, tmp_path: Path) -> None:
    out = tmp_path / "hf_s2"
    report = export_hf(eval_run.stage("s2"), eval_run.plan, out=out)
    assert report.stage == "s2" and report.rotary_base == 40000 and report.max_position_embeddings == S2_LEN

    ours = evaluate_path(
        eval_run.resolved(),
        eval_run.stage("s2"),
        stage="s2",
        settings=SETTINGS,
        base_reference=False,
        use_cache=False,
        out_dir=tmp_path / "eval",
    )
    results = ours.checkpoints[-1].results
    assert [r.length for r in results] == [64, 128, S2_LEN]

    tok = load_tokenizer(eval_run.tokenizer)
    grid = PasskeyGrid(
        tok,
        seed=SETTINGS.seed,
        key_digits=SETTINGS.key_digits,
        distractors=SETTINGS.distractors,
        filler=SETTINGS.filler,
    )
    score = hf.scorer(hf.load(out))
    for r in results:
        items = grid.grid([r.length], SETTINGS.depths, SETTINGS.keys_per_cell)
        theirs = PasskeyResult.from_items(
            r.length, SETTINGS.distractors, score_passkey(items, score, batch_size=SETTINGS.batch_size), 1.0
        )
        mine = r.passkey
        print(
            f"s2 @ {r.length}: passkey accuracy {mine.accuracy:.3f} (megatron-core) vs {theirs.accuracy:.3f} "
            f"(transformers); greedy {mine.greedy_accuracy:.3f} vs {theirs.greedy_accuracy:.3f}"
        )
        assert [i.key for i in mine.items] == [i.key for i in theirs.items]
        assert theirs.accuracy == mine.accuracy and theirs.greedy_accuracy == mine.greedy_accuracy
        for a, b in zip(mine.items, theirs.items, strict=True):
            assert a.greedy_tokens == b.greedy_tokens and a.loglik == b.loglik and a.greedy == b.greedy


def test_known_answer_model_retrieves_in_both(eval_run: EvalRun, tmp_path: Path) -> None:
    out = tmp_path / "hf_chain"
    # not a stage of the plan: its RoPE base is the base model's
    export_hf(eval_run.chain, eval_run.plan, out=out, stage="base")
    tok = load_tokenizer(eval_run.tokenizer)
    grid = PasskeyGrid(tok, distractors=2)
    # keys written digit by digit, as the chain model's answer is: distractors of the same form
    right = [
        grid.item(CHAIN_LEN, d, key=CHAIN_KEY, distractor_keys=["4 4 4 4 4", "1 2 1 2 1"])
        for d in (0.0, 0.5, 1.0)
    ]
    wrong = [
        grid.item(CHAIN_LEN, d, key="1 2 1 2 1", distractor_keys=["4 4 4 4 4", CHAIN_KEY]) for d in (0.0, 1.0)
    ]
    with eval_parallel(1) as par:
        score = model_scorer(load_model(checkpoint_info(eval_run.chain), par, max_length=CHAIN_LEN))
        ours = PasskeyResult.from_items(CHAIN_LEN, 2, score_passkey(right + wrong, score), 1.0)
    model = hf.load(out)
    theirs = PasskeyResult.from_items(CHAIN_LEN, 2, score_passkey(right + wrong, hf.scorer(model)), 1.0)
    for res in (ours, theirs):
        assert [s.greedy for s in res.items] == [True] * 3 + [False] * 2
        assert [s.loglik for s in res.items] == [True] * 3 + [False] * 2
    assert ours.accuracy == theirs.accuracy == pytest.approx(0.6)
    # transformers' own decoding continues the question with the key, and its tokenizer spells it
    from transformers import AutoTokenizer

    it = right[1]
    generated = hf.greedy(model, torch.tensor([it.prompt]), len(it.answer))[0, len(it.prompt) :].tolist()
    assert generated == it.answer
    assert AutoTokenizer.from_pretrained(str(out)).decode(generated).strip() == CHAIN_KEY
