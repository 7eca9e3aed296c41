"""The allow-list unpickler: what it accepts from Megatron pickles and what it refuses."""

from __future__ import annotations

import argparse
import io
import os
import pickle
import signal

import pytest
import torch

from longctx.checkpoint.unpickle import MegatronStub, safe_torch_load, safe_unpickle, stub_qualname
from longctx.errors import CheckpointError


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
    payload = b"\x80\x02ccopyreg\n_reconstructor\nq\x00cargparse\nNamespace\nq\x01cargparse\nNamespace\nq\x02N\x87q\x03R."
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
