"""Random bytes and random mutations of valid inputs, fed to the checkers: each either accepts the input
or refuses it with longctx's own error (what/where/fix); none raises anything else, and none writes."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.checkpoint import verify_checkpoint
from longctx.checkpoint.metadata import read_common_state, read_dcp_index
from longctx.checkpoint.tree import DirTree
from longctx.data.indexed import read_index, validate_index
from longctx.errors import LongctxError
from longctx.plan.load import load_plan
from tests.bad_input.harness import tree_state
from tests.fixtures.data import write_indexed_dataset

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` with a few bytes flipped, a slice cut out or the tail truncated (or random bytes)."""
    kind = draw(st.sampled_from(["flip", "cut", "truncate", "random", "splice"]))
    data = bytearray(original)
    if kind == "random" or not data:
        return draw(st.binary(max_size=4096))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "cut":
        a = draw(st.integers(0, len(data) - 1))
        del data[a : a + draw(st.integers(1, 64))]
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)) :]
    else:
        a = draw(st.integers(0, len(data)))
        data[a:a] = draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


def _contract(fn: Callable[[], object], root: Path) -> None:
    before = tree_state(root)
    try:
        fn()
    except LongctxError as err:
        assert err.what, err
    assert tree_state(root) == before


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory, flat_snapshot: Path) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("fuzz-valid")
    prefix = write_indexed_dataset(d / "ds", [[1, 2, 3, 4], [5, 6], [7] * 40])
    with io.BytesIO() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in sorted(flat_snapshot.iterdir()):
                tar.add(f, arcname=f"ckpt/{f.name}")
        archive = buf.getvalue()
    plan = (Path(__file__).resolve().parents[2] / "stages" / "tiny.toml").read_bytes()
    return {
        "idx": Path(prefix + ".idx").read_bytes(),
        "bin": Path(prefix + ".bin").read_bytes(),
        "metadata": (flat_snapshot / ".metadata").read_bytes(),
        "common": (flat_snapshot / "common.pt").read_bytes(),
        "tar": archive,
        "plan": plan,
    }


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


def _fresh(root: Path, name: str) -> Path:
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    return d


def test_idx_mutations(valid: dict[str, bytes], work: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = _fresh(work, "idx")
        (d / "ds.idx").write_bytes(data.draw(mutated(valid["idx"])))
        (d / "ds.bin").write_bytes(valid["bin"])
        _contract(lambda: validate_index(read_index(d / "ds")), d)

    run()


def test_dcp_metadata_mutations(valid: dict[str, bytes], work: Path, flat_snapshot: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = _fresh(work, "md")
        (d / ".metadata").write_bytes(data.draw(mutated(valid["metadata"])))
        _contract(lambda: read_dcp_index(DirTree(d), ""), d)

    run()


def test_common_pt_mutations(valid: dict[str, bytes], work: Path, flat_snapshot: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = _fresh(work, "common")
        shutil.copy(flat_snapshot / ".metadata", d / ".metadata")
        (d / "common.pt").write_bytes(data.draw(mutated(valid["common"])))
        tree = DirTree(d)
        _contract(lambda: read_common_state(tree, "", read_dcp_index(tree, "")), d)

    run()


def test_tar_mutations(valid: dict[str, bytes], work: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = _fresh(work, "tar")
        (d / "ck.tar").write_bytes(data.draw(mutated(valid["tar"])))
        _contract(lambda: verify_checkpoint(d / "ck.tar"), d)

    run()


def test_plan_mutations(valid: dict[str, bytes], work: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = _fresh(work, "plan")
        (d / "plan.toml").write_bytes(data.draw(mutated(valid["plan"])))
        _contract(lambda: load_plan(d / "plan.toml"), d)

    run()
