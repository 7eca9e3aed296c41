from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from longctx.data import optimal_dtype, read_index, validate_index
from longctx.data.indexed import dtype_holds_vocab
from longctx.errors import DatasetError
from tests.fixtures.data import write_indexed_dataset


def _megatron():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets import indexed_dataset

    return indexed_dataset


def test_reference_vector(tmp_path: Path) -> None:
    """Lengths [4, 3, 6] as uint16: pointers [0 8 14], document indices [0 1 2 3], 102 + 26 bytes."""
    prefix = write_indexed_dataset(
        tmp_path / "v", [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12, 13]], np.uint16
    )
    info = read_index(prefix)
    assert (info.version, info.dtype_code, info.dtype) == (1, 8, np.dtype(np.uint16))
    assert info.sequence_lengths.tolist() == [4, 3, 6]
    assert info.sequence_pointers.tolist() == [0, 8, 14]
    assert info.document_indices.tolist() == [0, 1, 2, 3]
    assert (info.idx_size, info.bin_size, info.tokens, info.documents) == (102, 26, 13, 3)
    assert info.one_sequence_per_document
    assert list(validate_index(info)) == []


def test_matches_megatron_reader(tmp_path: Path) -> None:
    docs = [[7] * 5, [[1, 2], [3], [4, 5, 6]], [9, 9], [[8], []]]
    prefix = write_indexed_dataset(tmp_path / "m", docs, np.int32)
    info = read_index(prefix)
    ds = _megatron().IndexedDataset(prefix)
    assert info.sequence_lengths.tolist() == ds.sequence_lengths.tolist()
    assert info.document_indices.tolist() == ds.document_indices.tolist()
    assert not info.one_sequence_per_document
    assert info.document_lengths().tolist() == [5, 6, 2, 1]
    assert [c.tolist() for c in info.iter_document_lengths(chunk_docs=3)] == [[5, 6, 2], [1]]
    assert list(validate_index(info)) == []


@pytest.mark.parametrize("vocab", [1, 255, 65499, 65500, 65536, 151936, 262145])
def test_dtype_rule_matches_megatron(vocab: int) -> None:
    assert optimal_dtype(vocab) == np.dtype(_megatron().DType.optimal_dtype(vocab))


def test_dtype_holds_vocab() -> None:
    assert dtype_holds_vocab(np.dtype(np.uint16), 65536)
    assert not dtype_holds_vocab(np.dtype(np.uint16), 65537)
    assert not dtype_holds_vocab(np.dtype(np.uint16), 262144)
    assert dtype_holds_vocab(np.dtype(np.int32), 262145)
    assert not dtype_holds_vocab(np.dtype(np.float32), 10)


def test_unreadable_indexes(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "x", [[1, 2, 3]], np.uint16)
    idx = Path(prefix + ".idx")
    good = idx.read_bytes()
    cases = {
        b"": ("idx-truncated", "truncated .idx: 0 bytes, shorter than the 34-byte header"),
        good[:20]: ("idx-truncated", "truncated .idx: 20 bytes, shorter than the 34-byte header"),
        good[:40]: (
            "idx-truncated",
            "truncated .idx: 40 bytes, but 1 sequences and 2 document indices need 62",
        ),
        good[:17] + bytes([9]) + good[18:]: ("idx-dtype", "unknown dtype code 9 in .idx"),
    }
    for data, (code, message) in cases.items():
        idx.write_bytes(data)
        with pytest.raises(DatasetError) as err:
            read_index(prefix)
        assert err.value.code == code  # type: ignore[attr-defined]
        assert err.value.what.startswith(message), err.value.what


def test_missing_prefix_names_files(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "p", [[1, 2]], np.uint16)
    with pytest.raises(DatasetError, match=r"missing prefix: .*q \(q.idx and q.bin not found\)"):
        read_index(tmp_path / "q")
    with pytest.raises(DatasetError, match=r"without the \.bin/\.idx suffix"):
        read_index(prefix + ".bin")


def test_validate_finds_inconsistent_pointers_and_doc_indices(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "p", [[1, 2], [3, 4, 5], [6]], np.int32)
    idx = Path(prefix + ".idx")
    data = bytearray(idx.read_bytes())
    n = 3
    data[34 + 4 * n + 8 : 34 + 4 * n + 16] = (9).to_bytes(8, "little")  # pointer 1 should be 8
    idx.write_bytes(bytes(data))
    f = validate_index(read_index(prefix))
    assert f.codes("error") == ["pointers"]
    assert "sequence pointer 1 is 9, but the lengths before it give 8" in f.errors[0].message

    prefix2 = write_indexed_dataset(tmp_path / "q", [[1, 2], [3]], np.int32)
    idx2 = Path(prefix2 + ".idx")
    data = bytearray(idx2.read_bytes())
    data[34 + 12 * 2 + 16 : 34 + 12 * 2 + 24] = (1).to_bytes(8, "little")  # last document index 2 -> 1
    idx2.write_bytes(bytes(data))
    f = validate_index(read_index(prefix2))
    assert "doc-indices" in f.codes("error")
    assert any("document indices run from 0 to 1, expected 0 to 2" in x.message for x in f.errors)
