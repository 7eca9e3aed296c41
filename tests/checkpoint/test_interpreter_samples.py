"""Checkpoints saved under both of Python's enum-pickling styles are read, checked and adopted.

`samples/py3.11.2` was saved by megatron-core under Debian 12's Python 3.11.2, which pickles an enum member
as `getattr(EnumClass, "NAME")` and `signal.SIGTERM` as a module global; `samples/py3.11.7` under 3.11.7,
which pickles `EnumClass(value)`. Both are committed (`samples/make_samples.py` rewrites them), so these
tests do not depend on the interpreter that runs the suite.
"""

from __future__ import annotations

import argparse
import io
import pickle
import pickletools
import shutil
import signal
import tarfile
import zipfile
from pathlib import Path

import pytest

from longctx.checkpoint.adopt import adopt
from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.unpickle import safe_torch_load, safe_unpickle, stub_qualname
from longctx.checkpoint.verify import verify_checkpoint
from longctx.errors import CheckpointError

SAMPLES = Path(__file__).parent / "samples"
BY_NAME, BY_VALUE = SAMPLES / "py3.11.2", SAMPLES / "py3.11.7"
ITER = "iter_0000003"


def _globals(pickle_bytes: bytes) -> set[str]:
    """The globals a pickle names (GLOBAL opcodes), e.g. {"__builtin__ getattr", "signal SIGTERM"}."""
    return {str(arg) for op, arg, _ in pickletools.genops(pickle_bytes) if op.name == "GLOBAL"}


def _common_pickle(sample: Path) -> bytes:
    with zipfile.ZipFile(sample / "save" / ITER / "common.pt") as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


def test_the_samples_are_written_in_both_styles() -> None:
    by_name, by_value = _globals(_common_pickle(BY_NAME)), _globals(_common_pickle(BY_VALUE))
    assert {"__builtin__ getattr", "signal SIGTERM"} <= by_name
    assert "signal Signals" not in by_name
    assert "__builtin__ getattr" not in by_value and "signal SIGTERM" not in by_value
    assert "signal Signals" in by_value
    # the DCP index pickles TensorProperties' memory format as an enum member: by name under 3.11.2
    assert b"getattr" in (BY_NAME / "save" / ITER / ".metadata").read_bytes()
    assert b"getattr" not in (BY_VALUE / "save" / ITER / ".metadata").read_bytes()


@pytest.mark.parametrize("sample", [BY_NAME, BY_VALUE], ids=["py3.11.2", "py3.11.7"])
@pytest.mark.parametrize("stub", [True, False], ids=["stubs", "megatron-enums"])
def test_common_state_read(sample: Path, stub: bool) -> None:
    data = (sample / "save" / ITER / "common.pt").read_bytes()
    state = safe_torch_load(data, where="common.pt", stub_megatron=stub)
    args = state["args"]
    assert state["iteration"] == 3 and args.exit_signal is signal.SIGTERM
    if stub:
        assert stub_qualname(args.model_type) == "megatron.core.enums.ModelType"
        assert "encoder_or_decoder" in repr(args.model_type) or args.model_type.value == 1
    else:
        from megatron.core.enums import ModelType

        assert args.model_type is ModelType.encoder_or_decoder


@pytest.mark.parametrize("sample", [BY_NAME, BY_VALUE], ids=["py3.11.2", "py3.11.7"])
def test_inspected_checked_and_adopted(sample: Path, tmp_path: Path) -> None:
    report = inspect_checkpoint(sample / "save")
    assert report.arch.num_layers == 1 and report.arch.hidden_size == 32
    assert verify_checkpoint(sample / "save").ok
    # as Ermine publishes: a tar holding the save dir, and a tar holding a tar of the iteration's files
    plain, inner, nested = tmp_path / "m.tar", tmp_path / "inner.tar", tmp_path / "m.tar.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(sample / "save", arcname="save")
    with tarfile.open(inner, "w") as tar:
        tar.add(sample / "save" / ITER, arcname="ckpt")
    with tarfile.open(nested, "w") as tar:
        tar.add(inner, arcname="inner.tar")
    for archive in (plain, nested):
        into = tmp_path / f"adopted-{archive.name}"
        result = adopt(archive, into)
        assert result.iteration == 3 and result.method == "extract" and result.verify.ok
        for f in (sample / "save" / ITER).iterdir():
            assert (into / ITER / f.name).read_bytes() == f.read_bytes()
    shutil.rmtree(tmp_path / "adopted-m.tar")


def _reduce(owner: bytes, attr: str) -> bytes:
    """A protocol-2 pickle of `getattr(<owner global>, attr)` as early 3.11 releases write an enum member."""
    a = attr.encode()
    return (
        b"\x80\x02c__builtin__\ngetattr\nq\x00c"
        + owner
        + b"\nq\x01X"
        + len(a).to_bytes(4, "little")
        + a
        + b"\x86R."
    )


def test_getattr_resolves_enum_members_only() -> None:
    assert safe_unpickle(_reduce(b"signal\nSignals", "SIGTERM")) is signal.SIGTERM
    assert safe_unpickle(b"\x80\x02csignal\nSIGINT\n.") is signal.SIGINT
    assert safe_unpickle(b"\x80\x02csignal\nSIG_IGN\n.") is signal.SIG_IGN
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    member = next(iter(_MEM_FORMAT_ENCODING))
    got = safe_unpickle(_reduce(b"torch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING", member.name))
    assert got is member


@pytest.mark.parametrize(
    ("owner", "attr"),
    [
        (b"posix\nsystem", "x"),  # the owner itself is not on the allow-list
        (b"os\nsystem", "x"),
        (b"argparse\nNamespace", "__init__"),
        (b"argparse\nNamespace", "x"),  # not an enum
        (b"signal\nSignals", "__class__"),  # not a member
        (b"signal\nSignals", "mro"),
        (b"signal\nSignals", "_member_map_"),
        (b"signal\nSignals", "NOT_A_SIGNAL"),
        (b"__builtin__\nobject", "__subclasses__"),
        (b"__builtin__\ngetattr", "x"),
    ],
)
def test_getattr_on_anything_else_refused(owner: bytes, attr: str) -> None:
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        safe_unpickle(_reduce(owner, attr), where="common.pt")


@pytest.mark.parametrize(
    "name", [b"signal\nsignal", b"signal\nraise_signal", b"signal\nsetitimer", b"os\nkill"]
)
def test_module_globals_other_than_members_refused(name: bytes) -> None:
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        safe_unpickle(b"\x80\x02c" + name + b"\n.")


def test_python2_names_go_through_the_allow_list() -> None:
    # protocol 2 writes builtins as __builtin__ and copyreg as copy_reg; mapped, then allow-listed
    ns = argparse.Namespace(a=1)
    assert safe_unpickle(pickle.dumps(ns, protocol=2)) == ns
    assert safe_unpickle(b"\x80\x02c__builtin__\nset\n)\x85R.") == set()
    with pytest.raises(CheckpointError, match=r"builtins\.eval"):
        safe_unpickle(b"\x80\x02c__builtin__\neval\n.")
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=2).dump(signal.SIGTERM)
    assert safe_unpickle(buf.getvalue()) is signal.SIGTERM
