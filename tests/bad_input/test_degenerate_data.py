"""Datasets of zero-length documents (written by megatron-core's own builder): every loop that walks
documents until it has gathered tokens refuses them at once, and no report divides by their zero tokens."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from longctx.data.coverage import distance_coverage
from longctx.errors import DatasetError, EvalError, StageError
from longctx.eval.data import HeldOut
from longctx.eval.loss_position import packed_windows
from longctx.plan.derive import open_plan
from longctx.plan.stage_data import require_startable
from tests.bad_input.harness import refused
from tests.fixtures.data import write_indexed_dataset
from tests.fixtures.eval import EvalRun
from tests.fixtures.plan_toml import tiny_plan_head

# each test's work is a few index reads: a loop that does not end fails here instead of eating memory
pytestmark = pytest.mark.timeout(120)
EOD = 2


@pytest.fixture
def zero(tmp_path: Path) -> str:
    """200 documents, none with a token."""
    return write_indexed_dataset(tmp_path / "data" / "zero", [[] for _ in range(200)], np.uint16)


def _plan(tmp_path: Path, manifest: Path, prefix: str, packing: str, split: str = "98,2,0") -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        tiny_plan_head("zero", tmp_path, manifest)
        + textwrap.dedent(f"""\
        prefixes = ["{prefix}"]
        split = "{split}"
        packing = "{packing}"
        [[stages]]
        name = "s1"
        seq_length = 128
        tokens = 4096
        global_batch_size = 4
        rope = {{ base = 100000 }}
        """)
    )
    return plan


@pytest.mark.parametrize("packing", ["documents", "concat"])
@pytest.mark.parametrize("command", ["plan-check", "data-check-plan", "data-check"])
def test_zero_length_documents_are_refused(
    command: str, packing: str, zero: str, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, oellm_like_manifest, zero, packing)
    args = {
        "plan-check": ["plan", "check", plan, "--check-data"],
        "data-check-plan": ["data", "check", zero, "--plan", plan],
        "data-check": ["data", "check", zero, "--lengths", "128"],
    }[command]
    t0 = time.monotonic()
    msg = refused(args, [tmp_path], needle="zero has 200 zero-length documents and no token")
    assert time.monotonic() - t0 < 60, msg
    assert "Traceback" not in msg and "ZeroDivisionError" not in msg


def test_coverage_refuses_a_dataset_without_a_token(zero: str) -> None:
    lengths = np.zeros(200, dtype=np.int64)
    with pytest.raises(DatasetError, match="200 zero-length documents and no token") as err:
        distance_coverage([lengths], [1.0], 128, packing="documents", causal=True, names=[zero])
    assert err.value.where == zero and err.value.fix
    # beside a dataset with tokens it is still refused: its own windows are what the loop would cut
    some = np.full(10, 64, dtype=np.int64)
    with pytest.raises(DatasetError, match="#2 of the blend has 200 zero-length"):
        distance_coverage([some, lengths], [1.0, 1.0], 128, packing="documents", causal=False)


def test_a_split_part_of_zero_length_documents_is_refused_before_a_launch(
    tmp_path: Path, oellm_like_manifest: Path
) -> None:
    # the train part holds tokens, the valid part only zero-length documents: megatron-core would
    # loop forever building it (an epoch of 0 tokens never reaches the one token it asks for)
    prefix = write_indexed_dataset(tmp_path / "data" / "tail", [[5, 6, 7, EOD]] * 50 + [[]] * 50, np.uint16)
    rp = open_plan(_plan(tmp_path, oellm_like_manifest, prefix, "concat", split="50,50,0"))
    with pytest.raises(StageError, match=r"tail \(valid part\) has 50 zero-length documents and no token"):
        require_startable(rp, rp.stages[0], "local")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("tail", "needle"),
    [([], "40 zero-length documents and no token"), ([EOD], "hold no token besides end-of-document")],
    ids=["zero-length", "eod-only"],
)
def test_packed_windows_refuse_held_out_documents_without_tokens(
    tail: list, needle: str, tmp_path: Path
) -> None:
    # the trained half has tokens, the held-out half none: the endless shuffled source must not spin
    prefix = write_indexed_dataset(tmp_path / "held", [[5, 6, 7, EOD]] * 40 + [tail] * 40, np.uint16)
    source = HeldOut([prefix], "50,50,0").shuffled_documents(1234, eod=EOD)
    with pytest.raises(EvalError, match=needle) as err:
        packed_windows(source, 256, 2, eod=EOD, seed=1234)
    assert "no window can be packed" in err.value.what and err.value.fix


def test_held_out_data_without_a_token_is_refused_before_it_is_mapped(zero: str) -> None:
    with pytest.raises(EvalError, match="zero has 200 zero-length documents and no token") as err:
        HeldOut([zero], None)
    assert err.value.fix


def test_eval_run_on_zero_length_documents(eval_run_copy: EvalRun, zero: str, tmp_path: Path) -> None:
    run = eval_run_copy
    args = ["eval", "run", run.stage("s1"), "--plan", run.plan, "--data", zero, "--out", tmp_path / "out"]
    refused(args, [run.root, tmp_path], needle="zero has 200 zero-length documents and no token")
    assert not (tmp_path / "out").exists()
