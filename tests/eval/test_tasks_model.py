"""The needle tasks on tiny real megatron-core models: a model whose answer is known, the engine's
multi-key and multi-value run giving the same answers at CP 2 as at CP 1, the diffusion path, and the
task fields of `eval run --json`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.eval.data import HeldOut
from longctx.eval.engine import CheckpointRef, evaluate_checkpoints
from longctx.eval.grid import PasskeyGrid
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.needles import TaskGrid
from longctx.eval.score import model_scorer
from longctx.eval.settings import EvalSettings
from longctx.eval.task_score import score_tasks
from longctx.mcore.parallel import eval_parallel
from longctx.plan.eval_tasks import parse_task
from longctx.tokenizer import load_tokenizer
from longctx.util.net import free_port
from tests.fixtures.eval import CHAIN_KEY, CHAIN_LEN, MINIMAL, S2_LEN, EvalRun

OTHER = "4 4 4 4 4"  # a key of the chain key's form and width
# multi-key and multi-value only, at three depths: small enough for two CPU processes
CP_SETTINGS = EvalSettings(
    depths=[0.0, 0.5, 1.0],
    keys_per_cell=2,
    distractors=0,
    loss_docs=1,
    short_docs=0,
    packed_windows=0,
    tasks=["multikey-2", "multivalue-2"],
    any_digit_keys=True,
)


def test_known_answer_tasks_through_megatron(eval_run: EvalRun) -> None:
    """The chain checkpoint answers every "… is" question with CHAIN_KEY: a hit where that is the asked
    needle's key, a miss where it is the other needle's, and the control returns it as a present key."""
    tok = load_tokenizer(eval_run.tokenizer)
    tasks = TaskGrid(PasskeyGrid(tok))
    mk, ab = parse_task("multikey-2"), parse_task("absent-2")
    items = [tasks.item(mk, CHAIN_LEN, d, keys=[CHAIN_KEY, OTHER]) for d in (0.0, 1.0)]
    items += [
        tasks.item(mk, CHAIN_LEN, 0.5, keys=[OTHER, CHAIN_KEY]),
        tasks.item(ab, CHAIN_LEN, 0.5, keys=[OTHER, CHAIN_KEY]),
    ]
    with eval_parallel(1) as par:
        score = model_scorer(load_model(checkpoint_info(eval_run.chain), par, max_length=CHAIN_LEN))
        got = score_tasks(items, score, tok.decode, batch_size=3)
    assert [s.hit for s in got] == [True, True, False, False]
    assert all(s.output.strip() == CHAIN_KEY for s in got)
    assert got[2].found == [False] and got[3].present_key == CHAIN_KEY and got[3].expected == []


def _evaluate(run: EvalRun, cp: int) -> list[dict[str, Any]]:
    tok = load_tokenizer(run.tokenizer)
    heldout = HeldOut([str(run.data_prefix)], "90,10,0")
    refs = [CheckpointRef("s2", run.stage("s2"))]
    report = evaluate_checkpoints(
        refs, lengths=[S2_LEN], tokenizer=tok, heldout=heldout, settings=CP_SETTINGS, short_length=64, cp=cp
    )
    (result,) = report.checkpoints[0].results
    return [t.model_dump(mode="json") for t in result.tasks]


def _join(rank: int, world: int, port: int) -> None:
    """The environment a spawned rank of a `world`-process group reads, one thread each."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)


def _assert_every_rank_answers_as(ref: list[dict[str, Any]], out: str, *, ranks: int) -> None:
    """Each rank's task results (written to OUT.RANK.json) equal `ref`, output tokens first."""
    for rank in range(ranks):
        got = json.loads(Path(f"{out}.{rank}.json").read_text())
        for mine, theirs in zip(got, ref, strict=True):
            assert [i["output_tokens"] for i in mine["items"]] == [
                i["output_tokens"] for i in theirs["items"]
            ]
            assert mine == theirs


def _cp_worker(rank: int, world: int, port: int, root: str, out: str) -> None:
    _join(rank, world, port)
    Path(f"{out}.{rank}.json").write_text(json.dumps(_evaluate(EvalRun(Path(root)), world)))


@pytest.mark.slow
def test_tasks_answer_the_same_at_cp2_as_at_cp1(eval_run: EvalRun, tmp_path: Path) -> None:
    """The engine's multi-key and multi-value items, generated through the ring at CP 2 (each rank its
    zigzag shard, every length split in 2·CP chunks), give the answers of one process, token for token."""
    import torch.multiprocessing as mp

    ref = _evaluate(eval_run, 1)
    assert [t["task"] for t in ref] == ["multikey-2", "multivalue-2"]
    assert all(len(t["items"]) == 6 for t in ref)
    out = str(tmp_path / "cp")
    mp.start_processes(
        _cp_worker, args=(2, free_port(), str(eval_run.root), out), nprocs=2, start_method="spawn"
    )
    _assert_every_rank_answers_as(ref, out, ranks=2)


def test_tasks_of_a_diffusion_checkpoint_by_infilling(tiny_run: Path, diffusion_checkpoints: Path) -> None:
    tok = load_tokenizer(tiny_run / "tokenizer")
    heldout = HeldOut([str(tiny_run / "data" / "corpus_text_document")], "98,2,0")
    settings = EvalSettings(
        depths=[0.0, 1.0],
        keys_per_cell=1,
        loss_docs=1,
        elbo_window=32,
        elbo_levels=[0.5],
        tasks=["multikey-2", "multivalue-2", "multiquery-2", "absent-2"],
    )
    refs = [CheckpointRef(label="mdm", path=diffusion_checkpoints / "mdm", allow_extrapolation=True)]
    report = evaluate_checkpoints(
        refs, lengths=[128], tokenizer=tok, heldout=heldout, settings=settings, short_length=64
    )
    (result,) = report.checkpoints[0].results
    assert [t.task for t in result.tasks] == ["multikey-2", "multivalue-2", "multiquery-2", "absent-2"]
    for t in result.tasks:
        assert t.keys == 2 and [c.depth for c in t.cells] == [0.0, 1.0]
        for s in t.items:
            slots = 2 if t.task in ("multivalue-2", "multiquery-2") else 1
            assert len(s.output.split(" ; ")) == slots and len(s.found) == (0 if t.control else slots)
    assert [x.task for x in report.task_summary] == ["single", *settings.tasks[1:]]


def test_run_json_carries_the_task_fields(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            *eval_run_copy.eval_run_args("s2"),
            "--lengths",
            "128,256",
            *MINIMAL,
            "--tasks",
            "multikey-2,multivalue-2,absent-1",
            "--any-digit-keys",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"]["tasks"] == ["single", "multikey-2", "multivalue-2", "absent-1"]
    assert data["settings"]["any_digit_keys"] is True and data["settings"]["ruler_threshold"] == 0.856
    summary = data["task_summary"]
    assert [t["task"] for t in summary] == ["single", "multikey-2", "multivalue-2", "absent-1"]
    for t in summary:
        assert [x["length"] for x in t["lengths"]] == [128, 256]
        assert {"ruler_effective_length", "relative_effective_length"} <= set(t)
        assert all(0 <= x["interval"][0] <= x["interval"][1] <= 1 for x in t["lengths"])
    assert summary[-1]["control"] and summary[-1]["lengths"][0]["present"] is not None
    tasks = data["checkpoints"][0]["results"][0]["tasks"]
    assert [t["task"] for t in tasks] == ["multikey-2", "multivalue-2", "absent-1"]
    assert {"hits", "keys", "interval", "cells", "items"} <= set(tasks[0])
    assert {"output", "found", "hit", "expected", "present_key"} <= set(tasks[1]["items"][0])
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| multivalue-2 | s2 |" in md and "RULER ≥85.6%" in md


def _infill_evaluate(run: str, ckpt: str, cp: int) -> list[dict[str, Any]]:
    tok = load_tokenizer(Path(run) / "tokenizer")
    heldout = HeldOut([str(Path(run) / "data" / "corpus_text_document")], "98,2,0")
    settings = CP_SETTINGS.model_copy(update={"elbo_window": 32, "elbo_levels": [0.5]})
    report = evaluate_checkpoints(
        [CheckpointRef("mdm", Path(ckpt), allow_extrapolation=True)],
        lengths=[128],
        tokenizer=tok,
        heldout=heldout,
        settings=settings,
        short_length=64,
        cp=cp,
    )
    (result,) = report.checkpoints[0].results
    return [t.model_dump(mode="json") for t in result.tasks]


def _infill_cp_worker(rank: int, world: int, port: int, run: str, ckpt: str, out: str) -> None:
    _join(rank, world, port)
    Path(f"{out}.{rank}.json").write_text(json.dumps(_infill_evaluate(run, ckpt, world)))


@pytest.mark.slow
def test_diffusion_tasks_decode_the_same_at_cp2_as_at_cp1(
    tiny_run: Path, diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    """Multi-key and multi-value by infilling, decoded one digit a round through the non-causal ring at
    CP 2: every rank fixes the same digits in the same rounds as one process does."""
    import torch.multiprocessing as mp

    ckpt = str(diffusion_checkpoints / "mdm")
    ref = _infill_evaluate(str(tiny_run), ckpt, 1)
    assert [t["task"] for t in ref] == ["multikey-2", "multivalue-2"]
    out = str(tmp_path / "cp")
    mp.start_processes(
        _infill_cp_worker, args=(2, free_port(), str(tiny_run), ckpt, out), nprocs=2, start_method="spawn"
    )
    _assert_every_rank_answers_as(ref, out, ranks=2)
