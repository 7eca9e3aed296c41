"""The child process of `longctx.stage.preflight`: a stage argv through Megatron-LM's own code.

    python -m longctx.stage.preflight_worker REQUEST.json

Importing `megatron.training` changes global state (argparse globals, Megatron's global args, torch.cuda
stand-ins, torch.distributed), so it only ever happens here, in a process of its own. The request names the
entry script (pretrain_gpt.py of a checkout, or a fork's), the device facts of the target cluster and the
argv of each stage; the result (one JSON document) goes to the path the request names, whatever happens.
Megatron's own output goes to this process's stdout/stderr, which the parent keeps for the report.

For each stage, in order (a stage stops at its first failing check):

1. `entry-script` — the entry script runs as `__main__` with `megatron.training.pretrain` replaced by a
   recorder, so what it would hand to `pretrain` (model provider, `args_defaults`, `extra_args_provider`)
   is exactly what a launch would use.
2. `parse_args` — `megatron.training.arguments.parse_args(extra_args_provider, ignore_unknown_args=False)`
   with `sys.argv` set to the argv (argparse's error text on failure).
3. `validate_args` — with `RANK`, `WORLD_SIZE`, `LOCAL_RANK` set as torchrun would, and torch.cuda's device
   queries answered from the facts (the login node has no GPU).
4. `transformer_config` — `core_transformer_config_from_args`, with TransformerEngine present or absent as
   the facts say.
5. `transformer_impl` — longctx's own check: `--transformer-impl transformer_engine` needs TE.
6. `rotary` — the model the entry script's model provider builds (tiny widths, CPU, world size 1, gloo),
   its rotary `inv_freq` against 1/base^(2i/d) of the stage's base, and positions up to the stage length.

Only the standard library, pydantic (the request and reply, `longctx.stage.preflight_protocol`) and torch are
imported before the entry script runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.stage.preflight_protocol import (
    Check,
    PreflightReply,
    PreflightRequest,
    StageRequest,
    StageResult,
    TargetFacts,
)


class _Captured(Exception):
    """Raised by the `pretrain` recorder: the entry script got as far as calling it."""


def _where(err: BaseException) -> str | None:
    """file:line of the innermost frame that raised (Megatron's own code, usually)."""
    tb = traceback.extract_tb(err.__traceback__)
    if not tb:
        return None
    frame = tb[-1]
    return f"{frame.filename}:{frame.lineno}"


def _message(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# -- stand-ins --------------------------------------------------------------------------------------


def _stub_batch_invariant_kernels(stood_in: list[str]) -> None:
    """megatron/training/initialize.py imports this module, which imports triton at module level;
    training on a login node never reaches it, so without triton a stand-in module takes its place."""
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        return
    mod = types.ModuleType(name)

    def _unavailable(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("batch-invariant kernels need triton (longctx preflight stand-in)")

    mod.enable_batch_invariant_mode = _unavailable  # type: ignore[attr-defined]
    mod.disable_batch_invariant_mode = _unavailable  # type: ignore[attr-defined]
    mod.is_batch_invariant_mode_enabled = lambda: False  # type: ignore[attr-defined]
    sys.modules[name] = mod
    stood_in.append(f"{name} (imports triton, absent here): a stand-in module")


@contextlib.contextmanager
def _device(facts: TargetFacts, gpus_per_node: int, calls: dict[str, int]) -> Iterator[None]:
    """torch.cuda's device queries answered from the target's facts; counted in `calls`."""
    import torch

    gpu = facts.gpu_arch
    count = gpus_per_node
    names = (
        "is_available",
        "device_count",
        "get_device_properties",
        "get_device_capability",
        "current_device",
    )
    saved = {n: getattr(torch.cuda, n) for n in names}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **k)

        return wrapper

    if gpu is not None:
        major, minor = int(gpu[0]), int(gpu[1])
        props = types.SimpleNamespace(
            name=facts.gpu_name or f"GPU (compute capability {major}.{minor})",
            major=major,
            minor=minor,
            total_memory=int(float(facts.gpu_memory_gib or 80) * 2**30),
            multi_processor_count=facts.multi_processor_count or 108,
            is_integrated=False,
            is_multi_gpu_board=False,
        )
        fns = {
            "is_available": lambda: True,
            "device_count": lambda: max(count, 1),
            "get_device_properties": lambda device=None: props,
            "get_device_capability": lambda device=None: (major, minor),
            "current_device": lambda: 0,
        }
    else:

        def no_gpu(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError(
                f"the target ({facts.source or 'these facts'}) has no GPU: torch.cuda device query refused"
            )

        fns = {
            "is_available": lambda: False,
            "device_count": lambda: 0,
            "get_device_properties": no_gpu,
            "get_device_capability": no_gpu,
            "current_device": no_gpu,
        }
    for n, fn in fns.items():
        setattr(torch.cuda, n, counted(n, fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.cuda, n, fn)


@contextlib.contextmanager
def _transformer_engine(version: str | None, stood_in: list[str]) -> Iterator[None]:
    """TransformerEngine present (at `version`) or absent, as far as TransformerConfig's checks ask."""
    import megatron.core.utils as mcu
    from megatron.core.models.common.embeddings import rope_utils

    names = ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd")
    saved = {n: getattr(rope_utils, n, None) for n in names}
    saved_version = getattr(mcu, "_te_version", None)
    if version is None:
        for n in names:
            setattr(rope_utils, n, None)
    else:

        def fused(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("TransformerEngine's fused RoPE stand-in (longctx preflight) cannot run")

        for n in names:
            if getattr(rope_utils, n, None) is None:
                setattr(rope_utils, n, fused)
                stood_in.append(f"megatron.core rope_utils.{n}: TransformerEngine's kernel (TE {version})")
        try:
            from packaging.version import Version

            mcu._te_version = Version(version)
        except Exception:
            pass
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(rope_utils, n, fn)
        mcu._te_version = saved_version


@contextlib.contextmanager
def _environ(values: dict[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _argparse_errors(seen: list[str]) -> Iterator[None]:
    """Record argparse's error text ("prog: error: unrecognized arguments: …") as it exits; stderr stays
    the real one (modules imported meanwhile register faulthandler on its file descriptor)."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> Any:
        seen.append(f"{self.prog}: error: {message}")
        return original(self, message)

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _argv(words: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = list(words)
    try:
        yield
    finally:
        sys.argv = saved


# -- the entry script -------------------------------------------------------------------------------


def _capture_entry(script: Path, argv: list[str]) -> dict[str, Any]:
    """Run the entry script as __main__ until it hands Megatron-LM its setup; what it passes, by name.

    Up to megatron-core 0.18 that is `pretrain(datasets, model_provider, …, args_defaults=…,
    extra_args_provider=…)`. From 0.19 the script parses first (`parse_and_validate_args(extra_args_provider,
    args_defaults=…)`) and hands `pretrain` a config container; the model provider is then the one it
    imports, `model_provider` bound to its `gpt_builder`, which builds the same model from the args."""
    import functools

    import megatron.training as mt
    import megatron.training.arguments as mta
    import megatron.training.training as mtt

    got: dict[str, Any] = {}

    def recorder(*args: Any, **kwargs: Any) -> None:
        names = ("train_valid_test_dataset_provider", "model_provider", "model_type", "forward_step_func")
        got.update(dict(zip(names, args, strict=False)))
        got.update(kwargs)
        raise _Captured

    def parse_recorder(
        extra_args_provider: Any = None,
        ignore_unknown_args: bool = False,
        args_defaults: dict[str, Any] | None = None,
    ) -> None:
        got.update(extra_args_provider=extra_args_provider, args_defaults=dict(args_defaults or {}))
        got["entry_style"] = "parse_and_validate_args"
        raise _Captured

    patched = [
        (mt, "pretrain", recorder),
        (mtt, "pretrain", recorder),
        (mta, "parse_and_validate_args", parse_recorder),
        (mt, "parse_and_validate_args", parse_recorder),
    ]
    missing = object()
    saved = [(mod, name, getattr(mod, name, missing)) for mod, name, _ in patched]
    for mod, name, fn in patched:
        setattr(mod, name, fn)
    # the script's globals stay readable when it stops at a recorder (runpy would drop them)
    scope: dict[str, Any] = {"__name__": "__main__", "__file__": str(script), "__builtins__": __builtins__}
    try:
        with _argv([str(script), *argv]):
            exec(
                compile(script.read_bytes(), str(script), "exec"), scope
            )  # the entry script, as python runs it
    except _Captured:
        pass
    finally:
        for mod, name, fn in saved:
            if fn is missing:
                delattr(mod, name)
            else:
                setattr(mod, name, fn)
    if (
        "model_provider" not in got
        and callable(scope.get("model_provider"))
        and callable(scope.get("gpt_builder"))
    ):
        got["model_provider"] = functools.partial(scope["model_provider"], scope["gpt_builder"])
    if "model_provider" not in got:
        raise RuntimeError(f"{script.name} ran to its end without calling megatron.training.pretrain")
    return got


def _provider_name(provider: Any) -> str:
    import functools

    parts = []
    while isinstance(provider, functools.partial):
        parts += [
            getattr(a, "__module__", "?") + "." + getattr(a, "__qualname__", repr(a))
            for a in provider.args
            if callable(a)
        ]
        provider = provider.func
    head = f"{getattr(provider, '__module__', '?')}.{getattr(provider, '__qualname__', repr(provider))}"
    return head + (f"({', '.join(parts)})" if parts else "")


# -- the rotary check -------------------------------------------------------------------------------


_DIST: dict[str, Any] = {}


def _init_parallel() -> None:
    import torch
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        fd, path = tempfile.mkstemp(prefix="longctx-preflight-")
        os.close(fd)
        os.unlink(path)
        torch.distributed.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
        _DIST["store"] = path
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _tiny(args: argparse.Namespace) -> argparse.Namespace:
    """The stage's args with tiny widths, one layer, world size 1, CPU, no fusions: the rotary module only
    depends on kv_channels, rotary_percent/interleaving, the base, scaling and the lengths, kept as they are."""
    import torch

    t = copy.copy(args)
    kv = int(args.kv_channels)
    over = {
        "num_layers": 1,
        "encoder_num_layers": 1,
        "decoder_num_layers": None,
        "num_attention_heads": 1,
        "num_query_groups": 1,
        "group_query_attention": False,
        "hidden_size": kv,
        "ffn_hidden_size": 16,
        "padded_vocab_size": 64,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "sequence_parallel": False,
        "world_size": 1,
        "data_parallel_size": 1,
        "num_experts": None,
        "moe_layer_freq": 1,
        "mtp_num_layers": None,
        "use_cpu_initialization": True,
        "bf16": False,
        "fp16": False,
        "params_dtype": torch.float32,
        "transformer_impl": "local",
        "apply_rope_fusion": False,
        "bias_swiglu_fusion": False,
        "bias_gelu_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "gradient_accumulation_fusion": False,
        "no_persist_layer_norm": True,
        "cross_entropy_loss_fusion": False,
        "recompute_granularity": None,
        "recompute_method": None,
        "recompute_num_layers": None,
        "distribute_saved_activations": False,
        "fp8": None,
        "fp4": None,
        "record_memory_history": False,
        "pipeline_model_parallel_layout": None,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
        "num_layers_in_first_pipeline_stage": None,
        "num_layers_in_last_pipeline_stage": None,
        "decoder_first_pipeline_num_layers": None,
        "decoder_last_pipeline_num_layers": None,
        "enable_cuda_graph": False,
        "attention_backend": None,
    }
    for k, v in over.items():
        if k == "attention_backend":
            from megatron.core.transformer.enums import AttnBackend

            v = AttnBackend.auto
        setattr(t, k, v)
    return t


def _rotary_modules(model: Any) -> list[tuple[str, Any]]:
    import torch

    out = []
    for name, mod in model.named_modules():
        inv = getattr(mod, "inv_freq", None)
        if isinstance(inv, torch.Tensor):
            out.append((name or "<model>", mod))
    return out


def _applied_base(inv: Any, dim: int) -> float:
    """The base b of inv_freq[i] = b^(-2i/d), read from its last entry."""
    k = len(inv) - 1
    if k <= 0:
        return float("nan")
    return math.exp(-math.log(float(inv[k])) * dim / (2 * k))


def _check_positions(mod: Any, inv: Any, length: int, cls: str, info: dict[str, Any]) -> None:
    """The angles the rotary module gives the stage's positions (what get_emb concatenates, before the CUDA
    move): as many as the stage trains at, each position × inv_freq; a problem is written into `info`."""
    import torch

    freqs_of = getattr(mod, "get_freqs_non_repeated", None)
    if callable(freqs_of):
        freqs = freqs_of(length).detach().to("cpu", torch.float64).reshape(-1, len(inv))
        info["positions"] = int(freqs.shape[0])
        if freqs.shape[0] < length:
            info["problem"] = (
                f"{cls}'s rotary module gives {freqs.shape[0]} positions for a {length}-token stage"
            )
            return
        err = float(
            (freqs[length - 1] - (length - 1) * inv).abs().max() / ((length - 1) * float(inv[0]) or 1.0)
        )
        info["last_position_rel_error"] = err
        if err > 1e-3:
            info["problem"] = (
                f"{cls}'s rotary angles at position {length - 1} differ from position × inv_freq "
                f"(relative {err:.3g}): positions are rescaled"
            )


def _rotary_check(
    provider: Any, args: argparse.Namespace, rotary_base: float, seq_length: int
) -> dict[str, Any]:
    import torch
    from megatron.training import global_vars

    tiny = _tiny(args)
    global_vars.set_args(tiny)
    _init_parallel()
    model = provider(pre_process=True, post_process=True)
    mods = _rotary_modules(model)
    cls = f"{type(model).__module__}.{type(model).__qualname__}"
    base = float(rotary_base)
    length = int(seq_length)
    dim = int(tiny.kv_channels)
    if getattr(tiny, "rotary_percent", 1.0) < 1.0:
        dim = int(dim * tiny.rotary_percent)
    want = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    info: dict[str, Any] = {
        "model_class": cls,
        "provider": _provider_name(provider),
        "rotary_dim": dim,
        "expected_base": base,
        "seq_length": length,
    }
    if not mods:
        info["problem"] = (
            f"the model the entry script builds ({cls}) has no rotary module (no inv_freq): "
            f"--rotary-base {rotary_base} would not be applied"
        )
        return info
    name, mod = mods[0]
    inv = mod.inv_freq.detach().to("cpu", torch.float64)
    applied = _applied_base(inv, dim)
    info.update(
        module=f"{name} ({type(mod).__module__}.{type(mod).__qualname__})",
        applied_base=applied,
        inv_freq_len=len(inv),
    )
    if len(inv) != len(want):
        info["problem"] = (
            f"{cls}'s rotary module {name} has {len(inv)} frequencies, 1/base^(2i/d) for rotary dim {dim} "
            f"has {len(want)}"
        )
        return info
    rel = float(((inv - want).abs() / want).max())
    info["max_rel_error"] = rel
    if rel > 1e-4:
        info["problem"] = (
            f"the model class {cls} (model provider {info['provider']}) applies RoPE base {applied:.6g}, not "
            f"the stage's --rotary-base {rotary_base} (rotary module {name}, largest relative "
            f"inv_freq error {rel:.3g}): it ignores --rotary-base"
        )
        return info
    interp = getattr(mod, "seq_len_interpolation_factor", None)
    if interp not in (None, 1, 1.0):
        info["problem"] = f"{cls}'s rotary module interpolates positions by {interp}: the stage plans none"
        return info
    msl = getattr(model, "max_sequence_length", None)
    info["max_sequence_length"] = msl
    if msl is not None and int(msl) < length:
        info["problem"] = f"{cls} is built for {msl} positions, the stage trains at {length}"
        return info
    _check_positions(mod, inv, length, cls, info)
    del model
    return info


# -- one stage --------------------------------------------------------------------------------------


def _stage(script: Path, job: StageRequest, facts: TargetFacts, stood_in: list[str]) -> StageResult:
    t0 = time.monotonic()
    out = StageResult(stage=job.stage)
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(job.world_size),
        "LOCAL_WORLD_SIZE": str(job.gpus_per_node or 1),
        "CUDA_DEVICE_MAX_CONNECTIONS": job.cuda_device_max_connections,
    }
    try:
        with _environ(env):
            _run_stage(_Stage(script, [str(w) for w in job.argv], job, facts, stood_in, out))
    finally:
        out.seconds = round(time.monotonic() - t0, 2)
    return out


@dataclasses.dataclass
class _Stage:
    """One stage's preflight in this process: what it checks against, and where results go."""

    script: Path
    argv: list[str]
    job: StageRequest
    facts: TargetFacts
    stood_in: list[str]
    out: StageResult

    def check(
        self, name: str, ok: bool, detail: str, message: str | None = None, where: str | None = None
    ) -> None:
        self.out.checks.append(Check(name=name, ok=ok, detail=detail, message=message, where=where))

    def failed(self, name: str, detail: str, err: BaseException) -> None:
        self.check(name, False, detail, _message(err), _where(err))
        self.out.traceback = traceback.format_exc()


def _run_stage(s: _Stage) -> None:
    """The checks in order; each step records its result and the first failure ends the stage."""
    entry = _entry_step(s)
    if entry is None:
        return
    args = _parse_step(s, entry)
    if args is None or not _validate_step(s, entry, args) or not _config_step(s, args):
        return
    if s.job.rotary:
        _rotary_step(s, entry["model_provider"], args)


def _entry_step(s: _Stage) -> dict[str, Any] | None:
    seen: list[str] = []
    try:
        with _argparse_errors(seen):
            entry = _capture_entry(s.script, s.argv)
    except SystemExit as err:
        # the entry script parsed the argv itself on the way (pretrain_gpt.py: maybe_wrap_for_inprocess_restart
        # calls parse_args(ignore_unknown_args=True)) and argparse refused it
        msg = seen[-1] if seen else f"{s.script.name} exited with {err.code}"
        s.check("entry-script", True, f"{s.script.name} imports")
        s.check(
            "parse_args",
            False,
            f"Megatron-LM's parser refuses the argv (while {s.script.name} starts)",
            msg,
            f"{s.script}",
        )
        return None
    except Exception as err:
        s.failed("entry-script", f"{s.script} did not get to megatron.training.pretrain", err)
        return None
    name = _provider_name(entry["model_provider"])
    if entry.get("entry_style") == "parse_and_validate_args":
        s.check(
            "entry-script",
            True,
            f"{s.script.name} parses through parse_and_validate_args and builds its model with {name}",
        )
    else:
        s.check("entry-script", True, f"{s.script.name} hands pretrain the model provider {name}")
    s.out.model_provider = name
    return entry


def _parse_step(s: _Stage, entry: dict[str, Any]) -> Any:
    # the checkout's own module: importable only once the entry script put the checkout on sys.path
    from megatron.training import arguments

    seen: list[str] = []
    try:
        with _argv([str(s.script), *s.argv]), _argparse_errors(seen):
            args = arguments.parse_args(entry.get("extra_args_provider"), ignore_unknown_args=False)
    except SystemExit as err:
        msg = seen[-1] if seen else f"argparse exited with {err.code}"
        s.check(
            "parse_args",
            False,
            "Megatron-LM's parser refuses the argv",
            msg,
            f"{arguments.__file__} parse_args",
        )
        return None
    except Exception as err:
        s.check("parse_args", False, "Megatron-LM's parser raised", _message(err), _where(err))
        return None
    s.check("parse_args", True, f"{len(s.argv)} words, ignore_unknown_args=False")
    return args


def _validate_step(s: _Stage, entry: dict[str, Any], args: Any) -> bool:
    from megatron.training import arguments  # the checkout's (see _parse_step)

    try:
        with _device(s.facts, s.job.gpus_per_node, s.out.device_calls):
            arguments.validate_args(args, entry.get("args_defaults") or {})
    except Exception as err:
        s.failed("validate_args", f"world size {args.world_size}", err)
        return False
    s.check("validate_args", True, f"world size {args.world_size}, data parallel {args.data_parallel_size}")
    return True


def _config_step(s: _Stage, args: Any) -> bool:
    from megatron.training import arguments  # the checkout's (see _parse_step)

    te = s.facts.transformer_engine
    try:
        with _device(s.facts, s.job.gpus_per_node, s.out.device_calls), _transformer_engine(te, s.stood_in):
            config = arguments.core_transformer_config_from_args(args)
    except Exception as err:
        s.failed("transformer_config", "TransformerConfig refuses the arguments", err)
        return False
    s.check("transformer_config", True, f"{type(config).__name__} built")
    if te is None and getattr(args, "transformer_impl", None) == "transformer_engine":
        s.check(
            "transformer_impl",
            False,
            "longctx's check",
            "--transformer-impl transformer_engine (Megatron-LM's default) needs TransformerEngine, which "
            "the target does not have",
            None,
        )
        return False
    return True


def _rotary_step(s: _Stage, provider: Any, args: Any) -> None:
    base = s.job.rotary_base if s.job.rotary_base is not None else args.rotary_base
    length = s.job.seq_length if s.job.seq_length is not None else args.seq_length
    try:
        info = _rotary_check(provider, args, base, length)
    except Exception as err:
        s.failed("rotary", "the entry script's model provider did not build a model on CPU", err)
        return
    s.out.rotary = info
    if "problem" in info:
        s.check("rotary", False, info["problem"], info["problem"], s.script.as_posix())
        return
    s.check(
        "rotary",
        True,
        f"{info['model_class']} applies base {info['applied_base']:.6g} (rotary dim {info['rotary_dim']}, "
        f"{info.get('positions', '?')} positions checked)",
    )


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    req = PreflightRequest.model_validate_json(Path(words[0]).read_text())
    script = Path(req.script)
    reply = PreflightReply()
    try:
        # as a launch sees it: the script's directory first (python puts it there, so a checkout that
        # carries its own megatron/core uses it), then $PYTHONPATH of the launch environment
        for i, p in enumerate([str(script.parent), *req.sys_path]):
            if p in sys.path:
                sys.path.remove(p)
            sys.path.insert(i, p)
        _stub_batch_invariant_kernels(reply.stood_in)
        for job in req.stages:
            reply.stages.append(_stage(script, job, req.facts, reply.stood_in))
    except BaseException as err:
        reply.error = _message(err)
        reply.traceback = traceback.format_exc()
    finally:
        with contextlib.suppress(Exception):
            import torch

            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        if "store" in _DIST:
            with contextlib.suppress(OSError):
                os.unlink(_DIST["store"])
        # default=str: the rotary findings may hold what the model reports as it is (a tensor's size)
        Path(req.result).write_text(json.dumps(reply.model_dump(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
