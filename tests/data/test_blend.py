from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.data import blend_from_prefixes, parse_blend, read_data_args
from longctx.errors import DatasetError
from tests.fixtures.data import write_indexed_dataset


@pytest.fixture
def two_prefixes(tmp_path: Path) -> tuple[str, str]:
    a = write_indexed_dataset(tmp_path / "a", [[1, 2, 0]], np.uint16)
    b = write_indexed_dataset(tmp_path / "b", [[3, 0]], np.uint16)
    return a, b


def test_weighted_and_plain(two_prefixes: tuple[str, str]) -> None:
    a, b = two_prefixes
    blend = parse_blend(f"0.3 {a}\n0.7 {b}")
    assert blend.ok and blend.weighted
    assert [(e.prefix, e.weight) for e in blend.entries] == [(a, 0.3), (b, 0.7)]
    assert blend.normalized_weights() == pytest.approx([0.3, 0.7])
    plain = parse_blend([a, b])
    assert plain.ok and not plain.weighted and plain.prefixes == [a, b]
    assert plain.normalized_weights([10, 30]) == [0.25, 0.75]
    assert parse_blend(a).prefixes == [a]
    assert blend_from_prefixes([a, b]).ok


def test_odd_count(two_prefixes: tuple[str, str]) -> None:
    a, _ = two_prefixes
    blend = parse_blend(f"0.3 {a} 0.7")
    assert blend.findings.codes("error") == ["blend-odd"]
    assert blend.findings.errors[0].message == (
        "odd number of words (3) in a weighted blend: Megatron would take all 3 words as prefixes and "
        "silently drop every weight"
    )
    with pytest.raises(DatasetError, match="odd number of words"):
        blend.raise_for_errors()


def test_bad_weights(two_prefixes: tuple[str, str]) -> None:
    a, b = two_prefixes
    cases = {
        f"-0.5 {a} 1 {b}": f"pair 1: negative weight -0.5 for {a}",
        f"1 {a} 0 {b}": f"pair 2: zero weight 0 for {b}",
        f"1 {a} nan {b}": f"pair 2: non-finite weight nan for {b}",
        f"1 {a} {b} 2": f"pair 2: {b!r} is not a number (expected 'WEIGHT PREFIX')",
        f"1 2 {a} {b}": "pair 1: '2' is a number where a prefix belongs",
    }
    for text, message in cases.items():
        msgs = [f.message for f in parse_blend(text).findings.errors]
        assert message in msgs, (text, msgs)


def test_missing_prefix_and_suffix_hint(two_prefixes: tuple[str, str], tmp_path: Path) -> None:
    a, _ = two_prefixes
    missing = str(tmp_path / "nope")
    f = parse_blend(f"1 {a} 1 {missing}").findings
    assert f.codes("error") == ["missing-prefix"]
    assert f.errors[0].message == f"missing prefix: {missing} ({missing}.idx and {missing}.bin not found)"
    f = parse_blend(f"{a}.bin").findings
    assert "drop the .bin/.idx suffix" in f.errors[0].message
    assert parse_blend(f"1 {missing}", check_exists=False).ok


def test_comments_duplicates_and_files(two_prefixes: tuple[str, str], tmp_path: Path) -> None:
    a, b = two_prefixes
    f = parse_blend(f"# mix\n1 {a}").findings
    assert "blend-comment" in f.codes("error")
    assert parse_blend(f"1 {a} 1 {a}").findings.codes("warning") == ["blend-duplicate"]
    path = tmp_path / "mix.txt"
    path.write_text(f"0.5 {a}\n0.5 {b}\n")
    blend = read_data_args(path)
    assert blend.ok and blend.source == str(path)
    with pytest.raises(DatasetError, match="data-args file not found"):
        read_data_args(tmp_path / "missing.txt")
    assert parse_blend("").findings.codes("error") == ["blend"]


_prefix = st.from_regex(r"[a-z][a-z0-9_/]{0,12}", fullmatch=True)
_weight = st.floats(0.001, 1000).map(lambda w: f"{w:g}")


@settings(deadline=None)
@given(
    st.lists(st.tuples(_weight, _prefix), min_size=1, max_size=6) | st.lists(_prefix, min_size=1, max_size=6)
)
def test_agrees_with_megatron_on_valid_blends(blend: list) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.utils import get_blend_from_list

    words = [w for pair in blend for w in pair] if isinstance(blend[0], tuple) else list(blend)
    ours = parse_blend(words, check_exists=False)
    assert ours.ok
    prefixes, weights = get_blend_from_list(words)
    assert ours.prefixes == prefixes
    assert [e.weight for e in ours.entries] == (weights or [None] * len(prefixes))
