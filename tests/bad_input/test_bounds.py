"""Inputs that would make longctx work without end or allocate without limit are refused at once."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tests.bad_input.harness import refused


class _Amplify:
    """Pickles as one call with a huge count: a few dozen bytes asking for gigabytes."""

    def __init__(self, factory: object, arg: object) -> None:
        self.factory, self.arg = factory, arg

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return self.factory, (self.arg,)


AMPLIFIERS = {
    "bytearray": _Amplify(bytearray, 10**10),
    "bytes": _Amplify(bytes, 10**10),
    "list-range": _Amplify(list, range(10**12)),
    "set-range": _Amplify(set, range(10**30)),
}


@pytest.mark.parametrize("case", sorted(AMPLIFIERS))
def test_metadata_pickle_amplification_is_refused(case: str, flat_snapshot: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(flat_snapshot, ck)
    data = pickle.dumps(AMPLIFIERS[case], protocol=2)
    assert len(data) < 80
    (ck / ".metadata").write_bytes(data)
    refused(["ckpt", "check", ck], [tmp_path], needle="refus")


def test_common_pt_amplification_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(flat_snapshot, ck)
    torch.save({"iteration": 1, "args": _Amplify(bytearray, 10**10)}, ck / "common.pt")
    refused(["ckpt", "check", ck], [tmp_path], needle="refus")


@pytest.mark.parametrize(
    "args",
    [
        [
            "rope",
            "suggest",
            "--rotary-dim",
            "128",
            "--base",
            "500000",
            "--from-length",
            "4096",
            "--lengths",
            "1152921504606846976",
        ],
        [
            "rope",
            "suggest",
            "--rotary-dim",
            "128",
            "--base",
            "500000",
            "--from-length",
            "4096",
            "--lengths",
            "64M",
        ],
        [
            "rope",
            "plot",
            "--bases",
            "5000000",
            "--rotary-dim",
            "128",
            "--lengths",
            "40000000",
            "--out",
            "{tmp}/c.png",
        ],
    ],
)
def test_lengths_beyond_any_context_are_refused(args: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    refused(argv, [tmp_path], needle="beyond what longctx plans for")


def _repeated_calls(n: int, times: int) -> bytes:
    """A pickle that calls list(range(n)) `times` times, each call under the per-call cap: the bound is
    on the whole pickle, so the repeats do not add up past it."""
    head = b"\x80\x02cbuiltins\nlist\nq\x00cbuiltins\nrange\nq\x01("
    call = b"h\x00h\x01K\x00J" + n.to_bytes(4, "little") + b"\x86R\x85R"
    return head + call * times + b"l."


def test_a_pickle_repeating_calls_under_the_cap_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(flat_snapshot, ck)
    data = _repeated_calls(1 << 21, 4)
    assert len(data) < 120
    (ck / ".metadata").write_bytes(data)
    msg = refused(["ckpt", "check", ck], [tmp_path], needle="refus")
    assert "in all" in " ".join(msg.split())


@pytest.mark.parametrize("shape", [(10**12, 64), (-4, 64)], ids=["10^12-rows", "negative"])
@pytest.mark.parametrize("command", ["check", "inspect"])
def test_an_index_with_an_impossible_shape_is_refused(
    shape: tuple[int, int], command: str, flat_snapshot: Path, tmp_path: Path
) -> None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ck = tmp_path / "ck"
    shutil.copytree(flat_snapshot, ck)
    meta = pickle.loads((ck / ".metadata").read_bytes())
    key = next(
        k
        for k, v in meta.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata) and "word_embeddings" in k
    )
    meta.state_dict_metadata[key].size = torch.Size(shape)
    (ck / ".metadata").write_bytes(pickle.dumps(meta))
    msg = " ".join(refused(["ckpt", command, ck], [tmp_path], needle="no model has it").split())
    assert key in msg
