"""The chunked, threaded scan agrees with a brute-force pass, whatever the block and task boundaries."""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.data import ScanParams, read_index, scan_datasets
from tests.fixtures.data import write_indexed_dataset

VOCAB, EOD, BOS = 50, 2, 1

_token = st.integers(-3, VOCAB + 3)
_seq = st.lists(_token, max_size=12)
_doc = st.lists(_seq, min_size=1, max_size=3)


def _brute(docs: list[list[list[int]]]) -> dict:
    flat = [t for d in docs for s in d for t in s]
    arr = np.asarray(flat, dtype=np.int64)
    nonempty = [(i, [t for s in d for t in s]) for i, d in enumerate(docs)]
    nonempty = [(i, toks) for i, toks in nonempty if toks]
    bad_eod = [i for i, toks in nonempty if toks[-1] != EOD]
    oor = [(k, int(v)) for k, v in enumerate(arr) if v < 0 or v >= VOCAB]
    return {
        "max_id": int(arr.max()) if arr.size else None,
        "out_of_range": len(oor),
        "first_out_of_range": oor[0] if oor else None,
        "eod_count": int((arr == EOD).sum()),
        "documents_checked": len(nonempty),
        "documents_without_eod": len(bad_eod),
        "first_document_without_eod": bad_eod[0] if bad_eod else None,
        "documents_starting_with_bos": sum(toks[0] == BOS for _, toks in nonempty),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_doc, min_size=1, max_size=12),
    st.integers(1, 9),
    st.integers(1, 40),
    st.integers(1, 3),
    st.sampled_from([np.int32, np.int64]),
)
def test_scan_matches_brute_force(docs, block_items, task_items, workers, dtype) -> None:
    if not any(t for d in docs for s in d for t in s):
        docs = [*docs, [[5, EOD]]]
    with tempfile.TemporaryDirectory() as tmp:
        prefix = write_indexed_dataset(f"{tmp}/d", docs, dtype)
        info = read_index(prefix)
        item = info.itemsize
        [res] = scan_datasets(
            [info],
            [ScanParams(VOCAB, EOD, BOS)],
            workers=workers,
            block_bytes=block_items * item,
            task_bytes=task_items * item,
            progress=False,
        )
        want = _brute(docs)
        got = {k: getattr(res, k) for k in want}
        assert got == want
        assert res.tokens_scanned == info.tokens


def test_several_prefixes_in_parallel(tmp_path) -> None:
    a = write_indexed_dataset(tmp_path / "a", [[3, 4, EOD]] * 50, np.uint16)
    b = write_indexed_dataset(tmp_path / "b", [[VOCAB + 1, EOD], [7, 8]], np.int32)
    ra, rb = scan_datasets(
        [read_index(a), read_index(b)],
        [ScanParams(VOCAB, EOD, None)] * 2,
        workers=2,
        task_bytes=16,
        progress=False,
    )
    assert (ra.out_of_range, ra.documents_without_eod, ra.eod_count) == (0, 0, 50)
    assert (rb.out_of_range, rb.first_out_of_range, rb.documents_without_eod) == (1, (0, VOCAB + 1), 1)
