"""The real Megatron-LM (`$LONGCTX_MEGATRON_LM`) trains with `--context-parallel-size 2` on the CPU.

Megatron-LM's local `DotProductAttention` refuses context parallelism; `--spec
longctx.mcore.megatron_lm_spec layer_spec` builds the layers with longctx's `LongctxCoreAttention`
(ring attention over gloo) instead. Two launches of the real `pretrain_gpt.py` through
`python -m longctx.mcore.run_megatron_lm` (shim 12 reports an A100-class device and sets
CUDA_DEVICE_MAX_CONNECTIONS=1, which validate_args asks for when CP > 1): CP 1 in one process and CP 2
in two (data-parallel size 1 in both, so the same samples in the same order), fp32, same seed, mock
data. Megatron-LM zigzag-splits tokens/labels/loss mask/positions (get_batch_on_this_cp_rank) and RoPE
(get_pos_emb_on_this_cp_rank); each CP rank's attention sees 128 of the 256 tokens.

Tolerance: the per-iteration `lm loss` of CP 2 is within LOSS_RTOL = 1e-5 (relative) of CP 1.
Measured on a 2-core machine: at most 1 unit in the 7th printed digit (|Δ| ≤ 1e-6, relative ≤ 2e-7).
With RoPE sliced contiguously instead of zigzag (a deliberately wrong CP 2 run) the four losses moved
by 5.7e-4, 7.3e-4, 1.8e-3, 2.6e-3 (relative 1e-4 to 4.5e-4: 10-45 times the tolerance).
Each launch is about 8 s of start-up on an idle machine (measured here under load: CP 1 20 s, CP 2 70 s,
nearly all of it imports; the four iterations take about 1 s).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from longctx.arch import ModelArch
from longctx.errors import AttentionError
from longctx.launch.local import LocalLauncher
from longctx.stage.megatron_args import cpu_flags

ITERS, SEQ = 4, 256
LOSS_RTOL = 1e-5
SPEC = ["--spec", "longctx.mcore.megatron_lm_spec", "layer_spec"]
ARCH = ModelArch(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=128,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=16,
)
_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([-+0-9.Ee]+) \|")


def cp_argv(script: Path, cp: int) -> list[str]:
    """A stage-like pretrain_gpt.py argv (longctx's architecture flags, fp32) on mock data, plus the CPU flags."""
    return [
        sys.executable,
        "-m",
        "longctx.mcore.run_megatron_lm",
        str(script),
        *ARCH.megatron_flags(),
        "--position-embedding-type",
        "rope",
        "--rotary-base",
        "10000",
        "--seq-length",
        str(SEQ),
        "--max-position-embeddings",
        str(SEQ),
        "--no-create-attention-mask-in-dataloader",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "256",
        "--tensor-model-parallel-size",
        "1",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        str(cp),
        "--cp-comm-type",
        "p2p",
        "--use-distributed-optimizer",
        "--attention-softmax-in-fp32",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "2",
        "--train-iters",
        str(ITERS),
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-4",
        "--lr-decay-style",
        "cosine",
        "--lr-warmup-iters",
        "1",
        "--seed",
        "1234",
        "--log-interval",
        "1",
        "--eval-interval",
        str(ITERS + 1),
        "--eval-iters",
        "0",
        *SPEC,
        *cpu_flags(),
    ]


def lm_losses(log: str, nproc: int) -> dict[int, float]:
    """iteration → `lm loss` from the last rank's lines (Megatron-LM logs there; the launcher prefixes
    `[rank] ` when it runs more than one process)."""
    prefix = f"[{nproc - 1}] " if nproc > 1 else ""
    out: dict[int, float] = {}
    for line in log.splitlines():
        m = _LOSS.search(line)
        if m and line.startswith(prefix):
            out[int(m.group(1))] = float(m.group(2))
    return out


def _launch(script: Path, cp: int, log: Path) -> tuple[str, float]:
    t0 = time.monotonic()
    # one intra-op thread per process: two processes share two cores
    rc = LocalLauncher(echo=False).run(cp_argv(script, cp), nproc=cp, env={"OMP_NUM_THREADS": "1"}, log=log)
    seconds = time.monotonic() - t0
    text = log.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    return text, seconds


@pytest.mark.slow
def test_real_megatron_lm_context_parallel_2_matches_cp_1(megatron_lm: Path, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this is the CPU path (gloo, shims); with CUDA Megatron-LM runs untouched")
    from longctx.mcore.megatron_lm_spec import BUILT_MESSAGE

    script = megatron_lm / "pretrain_gpt.py"
    log1, s1 = _launch(script, 1, tmp_path / "cp1.log")
    log2, s2 = _launch(script, 2, tmp_path / "cp2.log")

    for log in (log1, log2):
        assert "Megatron-LM runs on the CPU with shims" in log and "pretend_ampere_device" in log
    assert "context-parallel size: 2" in log2
    # both CP ranks built their layers from the spec, with context parallelism 2
    built = [line for line in log2.splitlines() if BUILT_MESSAGE in line]
    assert {line[:4] for line in built} == {"[0] ", "[1] "}, built
    assert all("context_parallel_size=2" in line for line in built)
    assert any(BUILT_MESSAGE in line and "context_parallel_size=1" in line for line in log1.splitlines())

    cp1, cp2 = lm_losses(log1, 1), lm_losses(log2, 2)
    assert sorted(cp1) == sorted(cp2) == list(range(1, ITERS + 1)), (cp1, cp2)
    diffs = {i: abs(cp2[i] - cp1[i]) for i in cp1}
    for i in cp1:
        assert diffs[i] <= LOSS_RTOL * abs(cp1[i]), (i, cp1[i], cp2[i])
    assert cp1[ITERS] < cp1[1]  # it trains
    print(
        f"CP1 {s1:.1f} s, CP2 {s2:.1f} s; lm loss CP1 {cp1}, CP2 {cp2}; "
        f"max |Δ| {max(diffs.values()):.2e} (tolerance {LOSS_RTOL:.0e} relative)"
    )


# -- the spec module itself (no Megatron-LM checkout needed) ---------------------------------------------


def test_layer_spec_from_args_puts_longctx_attention_in_the_local_spec() -> None:
    from megatron.core.transformer.identity_op import IdentityOp

    from longctx.attention.megatron_adapter import LongctxCoreAttention
    from longctx.mcore.megatron_lm_spec import layer_spec_from_args

    spec = layer_spec_from_args(SimpleNamespace(normalization="RMSNorm", qk_layernorm=True))
    attn = spec.submodules.self_attention.submodules
    assert attn.core_attention is LongctxCoreAttention
    assert attn.q_layernorm is not IdentityOp and attn.k_layernorm is not IdentityOp
    plain = layer_spec_from_args(SimpleNamespace(normalization="LayerNorm", qk_layernorm=False))
    assert plain.submodules.self_attention.submodules.q_layernorm is IdentityOp
    with pytest.raises(AttentionError, match="multi_latent_attention"):
        layer_spec_from_args(SimpleNamespace(multi_latent_attention=True))


def test_layer_spec_is_what_import_module_hands_gpt_builder(monkeypatch, capsys) -> None:
    from megatron.core.transformer.spec_utils import ModuleSpec, import_module
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from longctx.attention.megatron_adapter import LongctxCoreAttention
    from longctx.mcore import megatron_lm_spec

    # gpt_builders.py: transformer_layer_spec = import_module(args.spec) — taken as it is, not called
    got = import_module(["longctx.mcore.megatron_lm_spec", "layer_spec"])
    assert got is megatron_lm_spec.layer_spec
    assert isinstance(got, ModuleSpec) and got.module is TransformerLayer

    # its submodules follow Megatron-LM's parsed arguments, read when the model is built
    args = SimpleNamespace(normalization="RMSNorm", qk_layernorm=True, context_parallel_size=2)
    monkeypatch.setattr(megatron_lm_spec, "_megatron_args", lambda: args)
    fresh = megatron_lm_spec.ArgsLayerSpec()
    assert fresh.submodules.self_attention.submodules.core_attention is LongctxCoreAttention
    assert fresh.submodules is fresh.submodules  # built once
    assert "context_parallel_size=2" in capsys.readouterr().out


def test_shim_12_is_registered() -> None:
    from longctx.mcore import megatron_lm_cpu

    assert [n for n, _ in megatron_lm_cpu.SHIMS][-1] == "pretend_ampere_device"
    assert megatron_lm_cpu._PretendDeviceProperties().major == 8
