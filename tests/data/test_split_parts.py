"""A split's parts as megatron-core builds them, and the start-up failures they imply."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)

from longctx.data.blend import Blend, BlendEntry
from longctx.data.indexed import read_index
from longctx.data.split_parts import split_parts, split_shares
from longctx.plan.split_check import split_findings
from tests.fixtures.data import write_indexed_dataset


@pytest.mark.parametrize("split", ["98,2,0", "99,1,0", "100,0,0", "1,1,1", "969,30,1", "0.5,0.5", "3,0,1"])
@pytest.mark.parametrize("n", [1, 7, 10, 99, 1000])
def test_parts_are_megatron_cores(tmp_path: Path, split: str, n: int) -> None:
    prefix = write_indexed_dataset(tmp_path / "d", [[1, 2, 3][: 1 + i % 3] for i in range(n)])
    info = read_index(prefix)
    assert split_shares(split) == pytest.approx(parse_and_normalize_split(split))
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    lengths = info.document_lengths()
    for part, bounds in zip(split_parts(info, split), matrix, strict=True):
        if bounds is None:
            assert not part.built
            continue
        first, end = round(bounds[0] * n), round(bounds[1] * n)  # as _build_megatron_dataset_splits
        assert (part.first, part.end) == (first, end)
        assert part.tokens == int(lengths[first:end].sum())


class _Stage:
    """What split_findings reads of a resolved stage."""

    def __init__(self, split: str, eval_iters: int, seq_length: int = 8) -> None:
        self.name, self.eval_iters, self.seq_length = "s", eval_iters, seq_length
        self.train_iters, self.global_batch_size, self.eval_interval = 4, 2, 100 if eval_iters else None
        self.extra_args: list[str] = []
        self.data = type("D", (), {"split": split})()


class _Plan:
    def __init__(self, megatron: bool) -> None:
        self.plan = type("P", (), {"model_fields_set": {"megatron"} if megatron else set()})()
        self.megatron = type("M", (), {"performance_args": ()})()
        self.slurm = type("S", (), {"backend": None})()
        self.local = type("L", (), {"eval_after_stage": True})()


def test_an_empty_part_is_an_error_on_every_backend(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "d", [[1, 2, 3, 4]] * 10)  # 2 % of 10 documents: none
    blend = Blend([BlendEntry(prefix, None)], False, "test")
    for backend in ("local", "megatron-lm", None):
        found = split_findings(_Plan(False), _Stage("98,2,0", eval_iters=5), blend, backend)  # type: ignore[arg-type]
        assert [f.code for f in found.errors] == ["split-empty-part"], backend
        assert "valid part 2.00% of d's 10 documents, which rounds to none" in found.errors[0].message
    assert not split_findings(_Plan(False), _Stage("90,10,0", 5), blend, "local")  # type: ignore[arg-type]


def test_no_eval_samples_is_a_megatron_lm_refusal(tmp_path: Path) -> None:
    a = write_indexed_dataset(tmp_path / "a", [[1] * 20] * 50)
    b = write_indexed_dataset(tmp_path / "b", [[2] * 20] * 50)
    weighted = Blend([BlendEntry(a, 0.5), BlendEntry(b, 0.5)], True, "test")
    stage = _Stage("90,10,0", eval_iters=0)
    assert not split_findings(_Plan(False), stage, weighted, "local")  # type: ignore[arg-type]
    on_megatron = split_findings(_Plan(False), stage, weighted, "megatron-lm")  # type: ignore[arg-type]
    assert [f.code for f in on_megatron.errors] == ["split-no-eval-samples"]
    assert "(10 documents)" in on_megatron.errors[0].message
    # plan check: an error in a plan meant for the cluster, a warning in one for the local backend
    assert split_findings(_Plan(True), stage, weighted, None).errors  # type: ignore[arg-type]
    local = split_findings(_Plan(False), stage, weighted, None)  # type: ignore[arg-type]
    assert [f.level for f in local] == ["warning"]
    # evaluation on, or no validation part: nothing to say
    assert not split_findings(_Plan(True), _Stage("90,10,0", 1), weighted, "megatron-lm")  # type: ignore[arg-type]
    all_train = split_findings(_Plan(True), _Stage("100,0,0", 0), weighted, "megatron-lm")  # type: ignore[arg-type]
    assert not all_train.errors and [f.code for f in all_train] == ["split-no-heldout"]
    # one unweighted dataset: one pass over the part; enough tokens for a sample is fine, too few is not
    single = Blend([BlendEntry(a, None)], False, "test")
    assert not split_findings(_Plan(True), stage, single, "megatron-lm")  # type: ignore[arg-type]
    too_short = _Stage("90,10,0", 0, seq_length=200)
    short = split_findings(_Plan(True), too_short, single, "megatron-lm")  # type: ignore[arg-type]
    assert [f.code for f in short.errors] == ["split-no-eval-samples"]


def test_a_split_that_holds_out_nothing_warns_that_evaluation_will_find_no_haystack(tmp_path: Path) -> None:
    a = write_indexed_dataset(tmp_path / "a", [[1] * 20] * 50)
    b = write_indexed_dataset(tmp_path / "b", [[2] * 20] * 50)
    blend = Blend([BlendEntry(a, 0.5), BlendEntry(b, 0.5)], True, "test")
    for split in ("100,0,0", "100"):
        found = split_findings(_Plan(False), _Stage(split, 1), blend, "local")  # type: ignore[arg-type]
        assert [(f.code, f.level) for f in found] == [("split-no-heldout", "warning")], split
        assert "finds no held-out document" in found[0].message and "eval_after_stage" in found[0].message
        assert "98,2,0" in found[0].fix
    # one document held out of either dataset is enough
    for split in ("98,2,0", "0,1,0"):
        assert not [
            f
            for f in split_findings(_Plan(False), _Stage(split, 1), blend, "local")
            if f.code == "split-no-heldout"
        ]  # type: ignore[arg-type]
