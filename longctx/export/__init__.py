"""torch_dist → Hugging Face: a plan's stage (or its base) as a transformers model directory.

Public API::

    export_hf(checkpoint, plan, out=DIR, stage=None, dtype="auto", max_shard_bytes=5e9) -> ExportReport
    DcpReader(iter_dir).read(key, offsets, sizes)      # one region of one global tensor
    build_plan(source, arch, family, vocab_size)       # Megatron → HF names, layouts and reads
    SafetensorsWriter(dir, tensors, dtype, max_shard_bytes)

Qwen3-style (QK-norm) checkpoints become `Qwen3ForCausalLM`, Llama-style ones `LlamaForCausalLM`;
anything else, and diffusion LMs, is refused with the reason. transformers (the `hf` extra) is
imported only where the written config and tokenizer are read back.
"""

from longctx.errors import ExportError
from longctx.export.mapping import HfTensor, TensorPlan, build_plan
from longctx.export.reader import DcpReader
from longctx.export.run import DEFAULT_MAX_SHARD_BYTES, ExportReport, export_hf
from longctx.export.writer import SafetensorsWriter

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "DcpReader",
    "ExportError",
    "ExportReport",
    "HfTensor",
    "SafetensorsWriter",
    "TensorPlan",
    "build_plan",
    "export_hf",
]
