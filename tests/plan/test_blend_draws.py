"""megatron-core's blend arithmetic as longctx.plan.blend_draws predicts it, against the real GPTDataset,
BlendedDataset and BlendedMegatronDatasetBuilder on small datasets."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from longctx.data.indexed import read_index
from longctx.data.split_parts import split_parts
from longctx.plan.blend_draws import blend_draw, default_surplus, gpt_dataset_length, sufficient_surplus
from tests.fixtures.data import write_indexed_dataset

SEQ = 8


def config(prefixes: list[str], weights: list[float] | None, split: str, surplus: float) -> GPTDatasetConfig:
    """GPTDatasetConfig as longctx/train/data.py and Megatron-LM's pretrain_gpt.py build it."""
    tokenizer = SimpleNamespace(eod=2, pad=-1, vocab_size=512, unique_identifiers={"class": "test"})
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ,
        blend=(prefixes, weights),
        split=split,
        path_to_cache=None,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
        mid_level_dataset_surplus=surplus,
    )


def _dataset(tmp_path: Path, name: str, docs: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return write_indexed_dataset(tmp_path / name, [[3] * int(rng.integers(2, 30)) for _ in range(docs)])


@pytest.mark.parametrize("split", ["90,10,0", "70,20,10"])
def test_gpt_dataset_length_is_megatron_cores(tmp_path: Path, split: str) -> None:
    prefix = _dataset(tmp_path, "d", 40, seed=5)
    parts = split_parts(read_index(prefix), split)
    for sizes in ([1, 1, 1], [7, 3, 2], [50, 13, 9], [None, None, None]):
        built = BlendedMegatronDatasetBuilder(
            GPTDataset, sizes, lambda: True, config([prefix], None, split, default_surplus())
        ).build()
        for part, n, ds in zip(parts, sizes, built, strict=True):
            if part.built:  # whole epochs: often more than asked (and one epoch when nothing is asked)
                assert len(ds) == gpt_dataset_length(part.tokens, SEQ, n), (split, sizes, part.name)


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], None])
def test_the_draw_is_megatron_cores(tmp_path: Path, weights: list[float] | None) -> None:
    prefixes = [_dataset(tmp_path, f"d{i}", 60, seed=i) for i in range(3)]
    split, sizes = "80,20,0", [40, 9, 0]
    ds = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, config(prefixes, weights, split, default_surplus())
    ).build()
    for i in (0, 1):
        tokens = [split_parts(read_index(p), split)[i].tokens for p in prefixes]
        draw = blend_draw(weights, tokens, SEQ, sizes[i], default_surplus())
        assert draw is not None and not draw.oversampled
        real = ds[i]
        assert draw.lengths == tuple(len(d) for d in real.datasets)
        assert draw.drawn == tuple(np.bincount(real.dataset_index, minlength=3))
        assert draw.size == len(real)


def test_an_oversampled_blend_and_the_surplus_that_mends_it(tmp_path: Path) -> None:
    """Nine datasets whose validation part holds one short document each, a validation blend asked for one
    sample: megatron-core builds each for 2 samples and draws 9 by weight, 3 from the heaviest."""
    prefixes = [write_indexed_dataset(tmp_path / f"d{i}", [[3] * 20] * 9 + [[4] * 17]) for i in range(9)]
    weights = [0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.03]
    split, sizes = "90,10,0", [10, 1, 0]
    tokens = [split_parts(read_index(p), split)[1].tokens for p in prefixes]
    draw = blend_draw(weights, tokens, SEQ, 1, default_surplus())
    assert draw is not None and draw.oversampled == [0]
    assert (draw.drawn[0], draw.lengths[0], draw.targets[0]) == (3, 2, 2)
    with pytest.raises(
        IndexError, match="requests 3 samples from GPTDataset number 0 in excess of its size 2"
    ):
        BlendedMegatronDatasetBuilder(
            GPTDataset, sizes, lambda: True, config(prefixes, weights, split, 0.005)
        ).build()
    surplus = sufficient_surplus(weights, tokens, SEQ, draw)
    # built for ceil(1·(1 + s)) = 3 samples once s > 1: two epochs of 17 tokens make 4 samples of 8
    assert surplus == 1.01
    mended = blend_draw(weights, tokens, SEQ, 1, surplus)
    assert mended is not None and not mended.oversampled
    valid = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, config(prefixes, weights, split, surplus)
    ).build()[1]
    assert tuple(np.bincount(valid.dataset_index, minlength=9)) == mended.drawn
    # just below it, megatron-core refuses again: the suggestion is the smallest on its step
    below = blend_draw(weights, tokens, SEQ, 1, surplus - 0.01)
    assert below is not None and below.oversampled == [0]


def test_a_large_blend_that_fits_is_bounded_not_drawn() -> None:
    """Past EXACT_DRAW_MAX samples a weighted blend whose datasets hold floor(w·size) + 1 samples is not
    drawn (10 bytes a sample); the bound holds on megatron-core's own draw of a smaller blend."""
    weights = [0.5, 0.3, 0.2]
    draw = blend_draw(weights, [10**12] * 3, 1024, 50_000_000, 0.005)
    assert draw is not None and not draw.oversampled
    assert draw.drawn == tuple(math.floor(w * sum(draw.requested_per_dataset)) + 1 for w in weights)
    small = blend_draw(weights, [10**9] * 3, 1024, 10_007, 0.005)
    assert small is not None
    size = sum(small.requested_per_dataset)
    assert all(d <= math.floor(w * size) + 1 for d, w in zip(small.drawn, weights, strict=True))
