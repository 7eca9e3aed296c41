"""The allow-list unpickler: what it accepts from Megatron pickles and what it refuses."""

from __future__ import annotations

import argparse
import io
import os
import pickle
import signal
import time

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from longctx.checkpoint.unpickle import MegatronStub, safe_torch_load, safe_unpickle, stub_qualname
from longctx.errors import CheckpointError
from tests.fixtures import hostile_pickles as hp


class _Evil:
    def __reduce__(self):  # what a malicious checkpoint would carry
        return (os.system, ("echo pwned",))


def _torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_forbidden_global_is_refused() -> None:
    data = _torch_bytes({"args": argparse.Namespace(x=_Evil())})
    with pytest.raises(CheckpointError) as ei:
        safe_torch_load(data, where="common.pt")
    assert ei.value.what == (
        "refusing to unpickle: the pickle asks for posix.system, which is not on the checkpoint reader's "
        "allow-list (argparse.Namespace, Megatron enums, signal.Signals, torch dtypes/tensors, DCP metadata)"
    )
    assert ei.value.where == "common.pt"


@pytest.mark.parametrize(
    "global_", ["builtins eval", "builtins __import__", "subprocess Popen", "torch load"]
)
def test_other_globals_refused(global_: str) -> None:
    payload = b"\x80\x02c" + global_.replace(" ", "\n").encode() + b"\nq\x00."
    with pytest.raises(CheckpointError, match="refusing to unpickle: the pickle asks for"):
        safe_unpickle(payload, where="x")


def test_megatron_enums_stubbed_without_megatron() -> None:
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend

    args = argparse.Namespace(
        model_type=ModelType.encoder_or_decoder,
        attention_backend=AttnBackend.auto,
        exit_signal=signal.SIGTERM,
        params_dtype=torch.bfloat16,
        blob=b"\x00\xff",
        t=torch.arange(3),
    )
    loaded = safe_torch_load(_torch_bytes({"args": args}), stub_megatron=True)["args"]
    assert isinstance(loaded.model_type, MegatronStub)
    assert stub_qualname(loaded.model_type) == "megatron.core.enums.ModelType"
    # by value (`ModelType(1)`) or by name (`getattr(ModelType, "encoder_or_decoder")`), as the
    # interpreter running the suite pickles (both styles: test_interpreter_samples.py)
    by_value = loaded.model_type.name is None
    if by_value:
        assert loaded.model_type.value == ModelType.encoder_or_decoder.value
        assert repr(loaded.attention_backend) == f"AttnBackend({AttnBackend.auto.value})"
    else:
        assert repr(loaded.model_type) == "ModelType.encoder_or_decoder"
        assert repr(loaded.attention_backend) == "AttnBackend.auto"
    assert loaded.exit_signal is signal.SIGTERM
    assert loaded.params_dtype is torch.bfloat16
    assert loaded.blob == b"\x00\xff"
    assert torch.equal(loaded.t, torch.arange(3))
    real = safe_torch_load(_torch_bytes({"args": args}), stub_megatron=False)["args"]
    assert real.model_type is ModelType.encoder_or_decoder


def test_enum_pickled_by_name() -> None:
    # early 3.11 releases pickle enum members as getattr(EnumClass, "name")
    payload = (
        b"\x80\x02cbuiltins\ngetattr\nq\x00cmegatron.core.enums\nModelType\nq\x01X\x12\x00\x00\x00"
        b"encoder_or_decoderq\x02\x86q\x03Rq\x04."
    )
    obj = safe_unpickle(payload, stub_megatron=True)
    assert repr(obj) == "ModelType.encoder_or_decoder" and obj.name == "encoder_or_decoder"
    # getattr on anything but an enum class is refused
    evil = b"\x80\x02cbuiltins\ngetattr\nq\x00cargparse\nNamespace\nq\x01X\x08\x00\x00\x00__init__q\x02\x86q\x03R."
    with pytest.raises(CheckpointError, match=r"getattr\(<class 'argparse.Namespace'>, '__init__'\)"):
        safe_unpickle(evil)


def test_megatron_dataclass_stub_keeps_state(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    name = "megatron.core.optimizer.optimizer_config"
    module = types.ModuleType(name)

    class OptimizerConfig:  # stands in for Megatron's dataclass of the same name
        pass

    OptimizerConfig.__module__ = name
    OptimizerConfig.__qualname__ = "OptimizerConfig"
    module.OptimizerConfig = OptimizerConfig
    monkeypatch.setitem(sys.modules, name, module)
    cfg = OptimizerConfig()
    cfg.lr, cfg.optimizer = 3e-4, "adam"
    data = pickle.dumps(cfg, protocol=2)
    obj = safe_unpickle(data, stub_megatron=True)
    assert stub_qualname(obj) == f"{name}.OptimizerConfig"
    assert obj.lr == 3e-4 and obj.fields() == {"lr": 3e-4, "optimizer": "adam"}
    assert repr(obj) == "OptimizerConfig(lr=0.0003, optimizer='adam')"


def test_reconstructor_with_foreign_base_refused() -> None:
    # copyreg._reconstructor(cls, base, state) would call base.__init__: only plain bases pass
    payload = (
        b"\x80\x02ccopyreg\n_reconstructor\nq\x00"
        b"cargparse\nNamespace\nq\x01cargparse\nNamespace\nq\x02N\x87q\x03R."
    )
    with pytest.raises(CheckpointError, match=r"copyreg\._reconstructor with base"):
        safe_unpickle(payload)


def test_corrupt_pickles() -> None:
    with pytest.raises(CheckpointError) as ei:
        safe_unpickle(b"\x80\x04garbage", where="m", what="the DCP index (.metadata)")
    assert ei.value.what.startswith("cannot read the DCP index (.metadata): corrupt or not a pickle (")
    with pytest.raises(CheckpointError, match=r"cannot read common\.pt: corrupt or not a pickle"):
        safe_torch_load(b"PK\x03\x04not a zip", what="common.pt")


def test_megatron_015_metadata_class_is_read_as_torch_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron-core 0.15 pickled `.metadata` as its own subclass MCoreMetadata (extra `mcore_data`)."""
    import sys
    import types

    from torch.distributed.checkpoint.metadata import Metadata

    name = "megatron.core.dist_checkpointing.strategies.torch"
    module = types.ModuleType(name)

    class MCoreMetadata(Metadata):
        pass

    MCoreMetadata.__module__, MCoreMetadata.__qualname__ = name, "MCoreMetadata"
    module.MCoreMetadata = MCoreMetadata
    monkeypatch.setitem(sys.modules, name, module)
    md = MCoreMetadata(state_dict_metadata={}, storage_data={})
    md.mcore_data = {"k": {"nd_reformulated_orig_global_shape": (4, 8)}}
    data = pickle.dumps(md)
    monkeypatch.delitem(sys.modules, name)
    loaded = safe_unpickle(data, stub_megatron=True)
    assert type(loaded) is Metadata and loaded.mcore_data["k"]["nd_reformulated_orig_global_shape"] == (4, 8)


# ---- hostile opcode streams (tests/fixtures/hostile_pickles.py) -----------------------------------------


def _refused_quickly(data: bytes, needle: str, *, torch_zip: bool = False) -> str:
    """Load `data`, assert a CheckpointError naming `needle` within a loose time bound; return its text."""
    started = time.perf_counter()
    with pytest.raises(CheckpointError) as ei:
        if torch_zip:
            safe_torch_load(hp.torch_file(data), where="common.pt", what="common.pt")
        else:
            safe_unpickle(data, where="x.pkl")
    elapsed = time.perf_counter() - started
    print(f"refused in {elapsed:.3f} s: {ei.value.what}")
    assert elapsed < 5, elapsed
    assert needle in ei.value.what, ei.value.what
    assert ei.value.what.startswith("refusing to unpickle: ") and ei.value.fix
    return ei.value.what


def _legit_reads_still_work() -> None:
    """A plain Megatron-like common state still loads, and nothing the tests aimed at was changed."""
    assert argparse.Namespace.__getattribute__ is object.__getattribute__
    assert "__setstate__" not in vars(argparse.Namespace) and "__setstate__" not in vars(Metadata)
    assert "_missing_" not in vars(signal.Signals)
    assert signal.SIGTERM.value == 15 and signal.Signals(15) is signal.SIGTERM
    state = safe_torch_load(_torch_bytes({"iteration": 3, "args": argparse.Namespace(seq_length=4096)}))
    assert state["iteration"] == 3 and state["args"].seq_length == 4096


_DCP = "torch.distributed.checkpoint.metadata"
_OPT = "megatron.core.optimizer.optimizer_config"  # a Megatron class: an inert stub
_BUILD_ONTO = {
    # (None, {slots}) state: setattr(Namespace, "__getattribute__", getattr) breaks every later read
    "Namespace-slots": (
        hp.glob("argparse", "Namespace"),
        "__getattribute__",
        True,
        "onto the class argparse.Namespace",
    ),
    "Namespace-dict": (
        hp.glob("argparse", "Namespace"),
        "seq_length",
        False,
        "onto the class argparse.Namespace",
    ),
    "Metadata": (hp.glob(_DCP, "Metadata"), "__setstate__", True, f"onto the class {_DCP}.Metadata"),
    "Signals": (hp.glob("signal", "Signals"), "_missing_", True, "onto the class signal.Signals"),
    "SIGTERM-member": (hp.glob("signal", "SIGTERM"), "_value_", False, "onto an instance of signal.Signals"),
    "function": (hp.glob("_codecs", "encode"), "__defaults__", True, "onto the function"),
    "stub-class": (hp.glob(_OPT, "OptimizerConfig"), "x", True, f"onto the class {_OPT}.OptimizerConfig"),
}


@pytest.mark.parametrize("case", sorted(_BUILD_ONTO))
def test_build_onto_a_class_function_or_shared_object_is_refused(case: str) -> None:
    target, attr, slots, needle = _BUILD_ONTO[case]
    data = hp.build_onto(target, attr, hp.glob("builtins", "getattr"), slots=slots)
    msg = _refused_quickly(data, f"BUILD (set state) {needle}")
    assert "never onto a class, a function, a module or a shared object" in msg
    # inside a common.pt too, and the process is unharmed: later reads work
    _refused_quickly(data, f"BUILD (set state) {needle}", torch_zip=True)
    _legit_reads_still_work()


@pytest.mark.parametrize(
    ("attr", "slots"),
    [("__class__", True), ("__dict__", False), ("_get_kwargs", False), ("not an identifier", False)],
)
def test_build_sets_only_public_data_attributes_of_an_instance(attr: str, slots: bool) -> None:
    state = b"N" + hp.dict_of({attr: b"K\x01"}) + b"\x86" if slots else hp.dict_of({attr: b"K\x01"})
    data = hp.PROTO + hp.glob("argparse", "Namespace") + b")\x81" + state + b"b" + hp.STOP
    msg = _refused_quickly(data, f"BUILD sets attribute {attr!r} of an instance of argparse.Namespace")
    assert "no dunder or private name" in msg
    ok = hp.PROTO + hp.namespace({"seq_length": b"K\x01"}) + hp.STOP
    assert safe_unpickle(ok) == argparse.Namespace(seq_length=1)
    _legit_reads_still_work()


def test_build_cannot_replace_a_stub_method() -> None:
    data = hp.PROTO + hp.glob(_OPT, "OptimizerConfig") + b")\x81" + hp.dict_of({"fields": b"K\x01"})
    _refused_quickly(
        data + b"b" + hp.STOP, f"BUILD sets attribute 'fields' of an instance of {_OPT}.OptimizerConfig"
    )
    kept = safe_unpickle(data.replace(b"fields", b"ffn_ok") + b"b" + hp.STOP, stub_megatron=True)
    assert kept.fields() == {"ffn_ok": 1}


def test_memo_bomb_in_common_pt_is_refused_quickly() -> None:
    data = hp.memo_bomb(40)
    assert len(data) < 500
    msg = _refused_quickly(data, "objects in all", torch_zip=True)
    assert "counting each memo reference as every object it makes reachable" in msg
    _legit_reads_still_work()
    # a few levels are a plain shared structure, read as such
    args = safe_torch_load(hp.torch_file(hp.memo_bomb(4)))["args"]
    assert args.seq_length[0] is args.seq_length[1] and len(str(args.seq_length)) < 200


def test_deep_nesting_is_refused() -> None:
    _refused_quickly(hp.nested_lists(200_000), "objects nested more than 100 deep")
    _refused_quickly(hp.PROTO + b")" + b"\x85" * 200_000 + hp.STOP, "objects nested more than 100 deep")
    # a million MARKs never closed: each is a list the unpickler keeps (and the collector walks)
    _refused_quickly(hp.PROTO + b"(" * 1_000_000 + hp.STOP, "(MARKs left open)")
    assert safe_unpickle(hp.nested_lists(50)) is not None


def test_a_lazy_range_is_charged_before_anything_iterates_it() -> None:
    # torch.Size(range(10**9)): the range is lazy, torch.Size would build a tuple of 10**9
    data = (
        hp.PROTO
        + hp.glob("torch", "Size")
        + hp.glob("builtins", "range")
        + b"J\x00\xca\x9a\x3b\x85R\x85R"
        + hp.STOP
    )
    _refused_quickly(data, "a call range(…) of 1,000,000,000+ elements")
    assert safe_unpickle(data.replace(b"J\x00\xca\x9a\x3b", b"K\x03")) == torch.Size([0, 1, 2])


def test_an_integer_too_wide_to_print_is_refused() -> None:
    # LONG4 of a megabyte: loads in no time, then raises ValueError in any str() (the 4,300-digit limit)
    wide = b"\x8b" + (1 << 20).to_bytes(4, "little") + b"\x01" * (1 << 20)
    _refused_quickly(hp.PROTO + wide + hp.STOP, "an integer of 1,048,576 bytes (LONG4), more than 1,024")
    # what LONG4 carries within the cap is read exactly, as is every width pickle itself writes
    for n in (7, 2**64 + 1, -(2**2000), 256**1024 // 2 - 1):
        assert safe_unpickle(pickle.dumps(n, protocol=2)) == n
    _refused_quickly(pickle.dumps(256**1025, protocol=2), "(LONG4), more than 1,024")


def test_a_structure_changed_after_a_reference_handed_it_out_is_refused() -> None:
    # l = []; l.append(l): the reference was charged for an empty list
    _refused_quickly(
        hp.PROTO + b"]" + hp.put(0) + hp.get(0) + b"a" + hp.STOP, "APPEND changes a list that a memo"
    )
    # filling opcodes only fill plain containers: SETITEM onto a class is refused
    data = hp.PROTO + hp.glob("argparse", "Namespace") + hp.text("k") + b"K\x01s" + hp.STOP
    _refused_quickly(data, "SETITEM onto the class argparse.Namespace")
    # the same list referenced twice (not inside itself) is a plain shared structure
    shared = hp.PROTO + b"](K\x01K\x02e" + hp.put(0) + hp.get(0) + b"\x86" + hp.STOP
    first, second = safe_unpickle(shared)
    assert first is second and first == [1, 2]


def test_a_numpy_dtype_from_a_pickle_is_never_the_shared_one() -> None:
    numpy = pytest.importorskip("numpy")
    # dtype("f8", False, False) is numpy's shared float64; the BUILD would make it big-endian process-wide
    state = b"(K\x03" + hp.text(">") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
    data = (
        hp.PROTO
        + hp.glob("numpy", "dtype")
        + b"("
        + hp.text("f8")
        + b"\x89\x89t"
        + b"R"
        + state
        + b"b"
        + hp.STOP
    )
    loaded = safe_unpickle(data)
    assert loaded.byteorder == ">" and numpy.dtype("f8").byteorder == "="


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_args_read_under_every_protocol(protocol: int) -> None:
    """What the guarded machine checks (BUILD, references, calls) is what every protocol uses for a
    Namespace with shared, nested and enum values."""
    shared = [1, 2, {"k": (3.5, "x" * 200)}]
    args = argparse.Namespace(
        seq_length=4096,
        a=shared,
        b=shared,
        nested={"deep": [[[[1]]]]},
        sig=signal.SIGTERM,
        blob=b"\x00" * 100,
        s=frozenset({1, 2}),
        st={3},
        none=None,
    )
    loaded = safe_unpickle(pickle.dumps({"args": args, "iteration": 7}, protocol=protocol))
    assert loaded == {"args": args, "iteration": 7}
    assert loaded["args"].a is loaded["args"].b and loaded["args"].sig is signal.SIGTERM


def test_a_numpy_array_shape_is_charged_before_it_allocates() -> None:
    numpy = pytest.importorskip("numpy")
    array = numpy.arange(6, dtype=">f4").reshape(2, 3)
    data = pickle.dumps(array, protocol=2)
    assert (safe_unpickle(data) == array).all()
    # _reconstruct(ndarray, (2**30,), b"b") would allocate a GiB before its state is set
    huge = data.replace(b"K\x00\x85", b"J\x00\x00\x00\x40\x85", 1)
    assert huge != data
    _refused_quickly(huge, "a call numpy._reconstruct(…) of 4,194,305+ elements")
