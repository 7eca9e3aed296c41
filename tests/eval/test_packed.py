"""Loss by position on windows packed from several held-out documents: within-document scoring of a
window equals scoring each document on its own, through the real model; attention across documents
does not; CP 2 equals CP 1; the report, the table and the CLI's JSON carry the numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.eval.data import HeldOut
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.loss_position import (
    PackedLoss,
    document_index,
    later_mask,
    packed_loss_by_position,
    packed_windows,
)
from longctx.eval.score import model_scorer
from longctx.eval.settings import EvalSettings
from longctx.mcore.parallel import eval_parallel
from longctx.util.net import free_port
from tests.fixtures.eval import MINIMAL, S2_LEN, EvalRun

SEED = 1234


def _eod(run: EvalRun) -> int:
    from longctx.tokenizer import load_tokenizer

    eod = load_tokenizer(run.tokenizer).eod_id
    assert eod is not None
    return int(eod)


def _windows(run: EvalRun, eod: int, count: int = 2, seed: int = SEED) -> list[np.ndarray]:
    heldout = HeldOut([str(run.data_prefix)], "90,10,0")
    return packed_windows(heldout.shuffled_documents(seed), S2_LEN, count, eod=eod, seed=seed)


@pytest.fixture(scope="module")
def cp1(eval_run: EvalRun) -> dict[str, Any]:
    """The s2 model at CP 1: per-token log-probs of two packed windows across and within documents,
    and each document of them scored on its own."""
    eod = _eod(eval_run)
    windows = _windows(eval_run, eod)
    with eval_parallel(1) as par:
        loaded = load_model(checkpoint_info(eval_run.stage("s2")), par, max_length=S2_LEN)
        plain, within = model_scorer(loaded), model_scorer(loaded, eod=eod)
        batch = torch.from_numpy(np.stack(windows))
        plain_lp, within_lp = plain(batch).logprob, within(batch).logprob
        alone = []  # (window, start, end, log-probs of the document scored alone)
        for w, win in enumerate(windows):
            doc = document_index(win, eod)
            for k in range(int(doc[-1]) + 1):
                a, b = (int(x) for x in np.flatnonzero(doc == k)[[0, -1]])
                if b > a:
                    alone.append((w, a, b + 1, plain(torch.from_numpy(win[None, a : b + 1])).logprob[0]))
        packed = packed_loss_by_position(plain, within, windows, eod=eod)
    return dict(eod=eod, windows=windows, plain=plain_lp, within=within_lp, alone=alone, packed=packed)


def test_windows_are_deterministic_and_hold_several_documents(eval_run: EvalRun, cp1: dict[str, Any]) -> None:
    eod = cp1["eod"]
    again = _windows(eval_run, eod)
    assert all(np.array_equal(a, b) for a, b in zip(again, cp1["windows"], strict=True))
    assert not np.array_equal(_windows(eval_run, eod, seed=SEED + 1)[0], again[0])
    for win in again:
        assert len(win) == S2_LEN and document_index(win, eod)[-1] >= 1  # at least two documents
        assert (win == eod).sum() >= 1 and win[0] != eod
    assert len(_windows(eval_run, eod, count=5)) == 5  # the held-out documents are reused when needed


def test_within_documents_equals_each_document_alone(cp1: dict[str, Any]) -> None:
    within, plain = cp1["within"], cp1["plain"]
    first, later, across = [], [], []
    for w, a, b, lp in cp1["alone"]:
        # predictions a … b − 2 are of tokens a + 1 … b − 1, all inside the document
        diff = np.abs(within[w, a : b - 1] - lp)
        (first if a == 0 else later).append(float(diff.max()))
        if a > 0:
            across.append(float(np.abs(plain[w, a : b - 1] - lp).mean()))
    assert len(first) == 2 and len(later) >= 2
    print(
        f"within vs alone: first documents {max(first):.2e}, later {max(later):.2e}; "
        f"across vs alone (mean per later document) min {min(across):.3f}"
    )
    assert max(first) <= 1e-5 and max(later) <= 1e-5
    # the first document of a window has nothing before it: both scorings agree there
    for w, a, b, _ in cp1["alone"]:
        if a == 0:
            assert np.abs(plain[w, : b - 1] - within[w, : b - 1]).max() <= 1e-5
    # without boundaries, each later document is scored with the documents before it in context
    assert min(across) > 1e-2


def test_packed_summary_numbers(cp1: dict[str, Any]) -> None:
    pk: PackedLoss = cp1["packed"]
    mask = np.stack([later_mask(w, cp1["eod"]) for w in cp1["windows"]])
    assert pk.windows == 2 and pk.length == S2_LEN and pk.documents >= 4
    assert pk.later_tokens == int(mask.sum()) > 0
    assert pk.within_later_loss == pytest.approx(float(-cp1["within"][mask].mean()), abs=1e-9)
    assert pk.plain_later_loss == pytest.approx(float(-cp1["plain"][mask].mean()), abs=1e-9)
    assert pk.plain_loss == pytest.approx(float(-cp1["plain"].mean()), abs=1e-9)
    assert len(pk.plain) == len(pk.within) == len(pk.buckets) and all(x is not None for x in pk.within)
    assert pk.plain[0] == pytest.approx(pk.within[0], abs=1e-5)  # the first bucket is in the first document
    assert pk.plain_later_loss != pytest.approx(pk.within_later_loss, abs=1e-3)
    print(
        f"later documents: across {pk.plain_later_loss:.4f}, within {pk.within_later_loss:.4f} nats "
        f"({pk.later_tokens} tokens, {pk.documents} documents in {pk.windows} windows)"
    )


def _cp_worker(rank: int, world: int, port: int, ckpt: str, windows: np.ndarray, eod: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    with eval_parallel(world) as par:
        loaded = load_model(checkpoint_info(ckpt), par, max_length=windows.shape[1])
        plain, within = model_scorer(loaded), model_scorer(loaded, eod=eod)
        pk = packed_loss_by_position(plain, within, list(windows), eod=eod)
        lp = within(torch.from_numpy(windows)).logprob
    np.save(f"{out}.{rank}.npy", lp)
    Path(f"{out}.{rank}.json").write_text(pk.model_dump_json())


@pytest.mark.slow
def test_context_parallel_packed_equals_a_single_process(
    eval_run: EvalRun, cp1: dict[str, Any], tmp_path: Path
) -> None:
    """Each CP rank scores its zigzag shard with the boundaries of the full windows."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "cp")
    args = (2, free_port(), str(eval_run.stage("s2")), np.stack(cp1["windows"]), cp1["eod"], out)
    mp.start_processes(_cp_worker, args=args, nprocs=2, start_method="spawn")
    ref: PackedLoss = cp1["packed"]
    for rank in range(2):
        np.testing.assert_allclose(np.load(f"{out}.{rank}.npy"), cp1["within"], atol=1e-5)
        got = PackedLoss.model_validate_json(Path(f"{out}.{rank}.json").read_text())
        assert got.later_tokens == ref.later_tokens and got.documents == ref.documents
        for name in ("plain_loss", "within_loss", "plain_later_loss", "within_later_loss"):
            assert getattr(got, name) == pytest.approx(getattr(ref, name), abs=1e-5), name
        np.testing.assert_allclose(got.within, ref.within, atol=1e-5)
        np.testing.assert_allclose(got.plain, ref.plain, atol=1e-5)


def test_report_json_table_and_plot(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            *eval_run_copy.eval_run_args("s2"),
            "--lengths",
            str(S2_LEN),
            "--depths",
            "0",
            "--keys",
            "1",
            "--distractors",
            "0",
            "--loss-docs",
            "1",
            "--short-docs",
            "0",
            "--packed-windows",
            "2",
            "--no-base",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"]["packed_windows"] == 2
    pk = data["checkpoints"][0]["results"][0]["packed"]
    assert pk["windows"] == 2 and pk["length"] == S2_LEN and pk["later_tokens"] > 0
    for name in ("plain_loss", "within_loss", "plain_later_loss", "within_later_loss"):
        assert isinstance(pk[name], float) and 0 < pk[name] < 20
    assert len(pk["plain"]) == len(pk["within"]) == len(pk["buckets"])
    summary = (out / "summary.md").read_text()
    assert "| packed |" in summary
    assert f"{pk['plain_later_loss']:.3f} → {pk['within_later_loss']:.3f} @{S2_LEN}" in summary
    assert (out / "loss_by_position.png").read_bytes()[:4] == b"\x89PNG"
    # the setting is part of the cache fingerprint; 0 turns the measurement off
    assert EvalSettings(packed_windows=2).fingerprint() != EvalSettings(packed_windows=0).fingerprint()
    off = CliRunner().invoke(
        app,
        [
            *eval_run_copy.eval_run_args("s1"),
            "--lengths",
            "64",
            *MINIMAL,
            "--out",
            str(tmp_path / "off"),
            "--json",
        ],
    )
    assert off.exit_code == 0, off.output
    assert json.loads(off.stdout)["checkpoints"][0]["results"][0]["packed"] is None
    assert "packed" not in (tmp_path / "off" / "summary.md").read_text().split("\n")[2]
