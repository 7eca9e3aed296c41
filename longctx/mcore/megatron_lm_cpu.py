"""The shims that let the *real* Megatron-LM (a user's `pretrain_gpt.py`) train on a machine without CUDA.

`longctx.mcore.cpu` patches megatron-core for longctx's own trainer; this module is for Megatron-LM's
training loop (`megatron/training`), which assumes a GPU in many more places. Every shim below names
the call sites it covers and why it is needed. `apply_shims()` is applied by the runner
(`python -m longctx.mcore.run_megatron_lm`) before the script starts; it is idempotent and refuses to
patch anything when CUDA is available, so a GPU run executes the script untouched.

Nothing here changes the maths: the shims report a pretend device (CPU tensors stand in for CUDA ones),
skip GPU-only compilation and warm-up, back the "CUDA" RNG with a CPU generator, and bridge the two
places where the distributed optimizer expects a fused (Apex/TE) optimizer's state (no per-parameter `step`).

The CPU flags a launch needs on top of a GPU argv are `longctx.stage.megatron_args.cpu_flags()`.
Context parallelism (CP > 1) also needs `--spec longctx.mcore.megatron_lm_spec layer_spec`: Megatron's
local DotProductAttention refuses CP, longctx's core attention runs it (shim 12 covers the device queries);
a CP 1 stage past 8,192 tokens takes it too (the local attention holds s × s scores per head).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_lock = threading.Lock()
_applied: list[str] | None = None
# The "CUDA" default generator of the pretend device (shim `cuda_rng`).
_CUDA_RNG = torch.Generator()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def _refuse_on_cuda() -> None:
    if torch.cuda.is_available():
        raise RuntimeError("the Megatron-LM CPU shims must never be applied on a machine with CUDA")


def apply_shims() -> list[str]:
    """Patch torch and Megatron-LM for a CPU-only run; the names of the active shims ([] with CUDA).

    Imports `megatron.training` (the checkout must be on sys.path already).
    """
    global _applied
    if cuda_available():
        return []
    with _lock:
        if _applied is not None:
            return list(_applied)
        done: list[str] = []
        for name, shim in SHIMS:
            _refuse_on_cuda()
            if shim() is not False:
                done.append(name)
        _applied = done
    return list(done)


# -- 1. imports -----------------------------------------------------------------------------------------


def _stub_batch_invariant_kernels() -> bool:
    # megatron/training/initialize.py imports enable_batch_invariant_mode from
    # megatron.core.transformer.custom_layers.batch_invariant_kernels, which imports triton at module
    # level. A stub of that one module (a general triton stub breaks torch._inductor) lets the import
    # succeed; --batch-invariant-mode itself cannot run without triton and says so.
    if importlib.util.find_spec("triton") is not None:
        return False
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    if name in sys.modules:
        return False
    stub = types.ModuleType(name)
    stub.__doc__ = "longctx stub: the real module needs triton (not installed on this CPU machine)."

    def _needs_triton(*_a: object, **_k: object) -> Any:
        raise RuntimeError("batch-invariant mode needs triton, which this CPU-only machine lacks")

    stub.enable_batch_invariant_mode = _needs_triton  # type: ignore[attr-defined]
    stub.is_batch_invariant_mode_enabled = lambda: False  # type: ignore[attr-defined]  # megatron/rl imports it
    sys.modules[name] = stub
    return True


# -- 2-3. initialisation ----------------------------------------------------------------------------------


def _allow_no_cuda() -> None:
    # pretrain() (megatron/training/training.py) calls initialize_megatron(), which asserts
    # torch.cuda.is_available() unless allow_no_cuda=True.
    from megatron.training import training

    orig = training.initialize_megatron

    @functools.wraps(orig)
    def initialize_megatron(*args: Any, **kwargs: Any) -> Any:
        kwargs["allow_no_cuda"] = True
        return orig(*args, **kwargs)

    training.initialize_megatron = initialize_megatron


@contextlib.contextmanager
def _one_device() -> Iterator[None]:
    saved = torch.cuda.device_count, torch.cuda.set_device
    torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
    torch.cuda.set_device = lambda *_a, **_k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.device_count, torch.cuda.set_device = saved  # type: ignore[assignment]


def _one_device_for_groups_and_seed() -> None:
    # initialize.py creates the model-parallel groups (_initialize_distributed) and seeds the CUDA RNG
    # tracker (_set_random_seed) only `if torch.cuda.device_count() > 0`. Without the groups nothing
    # trains; with an unseeded tracker a resume sys.exit()s ("Unable to load rng state"). Both report
    # one device (and set_device does nothing) during these two calls only.
    from megatron.training import initialize

    for fn_name in ("_initialize_distributed", "_set_random_seed"):
        orig = getattr(initialize, fn_name)

        def with_one_device(*args: Any, _orig: Callable[..., Any] = orig, **kwargs: Any) -> Any:
            with _one_device():
                return _orig(*args, **kwargs)

        setattr(initialize, fn_name, functools.wraps(orig)(with_one_device))


def _skip_gpu_compilation() -> None:
    # _compile_dependencies (initialize.py) runs `make` in megatron/core/datasets on rank 0 — the wheel
    # ships the compiled helpers_cpp but no Makefile — and megatron.legacy.fused_kernels.load runs
    # `$CUDA_HOME/bin/nvcc -V`. set_jit_fusion_options → _warmup_jit_function allocates device="cuda"
    # tensors (with torch >= 2.2 it does nothing else). All three are skipped.
    from megatron.core.datasets import utils as dataset_utils
    from megatron.legacy import fused_kernels
    from megatron.training import initialize

    if importlib.util.find_spec("megatron.core.datasets.helpers_cpp") is None:
        raise RuntimeError(
            "megatron-core's compiled helpers_cpp is missing; it cannot be built on this machine"
        )
    dataset_utils.compile_helpers = lambda: None
    fused_kernels.load = lambda *_a, **_k: None
    initialize._warmup_jit_function = lambda: None


# -- 7-8. the pretend CUDA device -------------------------------------------------------------------------


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)  # a CUDA ordinal


class CudaToCpu(TorchFunctionMode):
    """Every device="cuda" (or CUDA ordinal) given to a torch function becomes the CPU; no pinned memory."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


_cuda_to_cpu: CudaToCpu | None = None


def _pretend_cuda_device() -> None:
    # training.py allocates device="cuda" tensors (startup timestamps, loss dicts, exit-duration flags,
    # eval/train flags: lines 806, 812, 1816, 2072, 2373, 3149, 3225, 3406 at core_v0.16.1), moves the
    # model with Module.cuda(torch.cuda.current_device()) (1258), pretrain_gpt.get_batch and
    # get_batch_on_this_tp_rank use .cuda(non_blocking=True); megatron-core sizes buffers on
    # torch.cuda.current_device() and synchronises around saves; clip_grads.py asserts
    # param.grad.type() == 'torch.cuda.FloatTensor'. The CUDA device maps to the CPU for the whole run
    # (a TorchFunctionMode), .cuda()/.pin_memory() return the tensor itself, current_device() is 0,
    # synchronize does nothing, and Tensor.type() reports the CUDA names of CPU tensors.
    global _cuda_to_cpu
    torch.Tensor.cuda = lambda self, *_a, **_k: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *_a, **_k: self  # type: ignore[method-assign]
    torch.Tensor.pin_memory = lambda self, *_a, **_k: self  # type: ignore[method-assign]
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *_a, **_k: None  # type: ignore[assignment]
    orig_type = torch.Tensor.type

    def tensor_type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs:
            name = orig_type(self)  # (the mode may hand this very function back: replace once)
            cpu = self.device.type == "cpu" and not name.startswith("torch.cuda.")
            return name.replace("torch.", "torch.cuda.", 1) if cpu else name
        return orig_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = tensor_type  # type: ignore[assignment, method-assign]
    _cuda_to_cpu = CudaToCpu()
    _cuda_to_cpu.__enter__()


class _Stream:
    """A CUDA stream/event that does nothing (work on the CPU is synchronous)."""

    def __init__(self, *_a: object, **_k: object) -> None:
        pass

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def __getattr__(self, _name: str) -> Callable[..., Any]:
        return lambda *_a, **_k: None

    def query(self) -> bool:
        return True

    def elapsed_time(self, _other: object) -> float:
        return 0.0


def _dummy_streams() -> None:
    # training.py builds the DDP wrappers inside `with torch.cuda.stream(torch.cuda.Stream())` after
    # `s.wait_stream(torch.cuda.current_stream())` (1325-1344), and megatron-core records events.
    torch.cuda.Stream = _Stream  # type: ignore[assignment, misc]
    torch.cuda.Event = _Stream  # type: ignore[assignment, misc]
    torch.cuda.current_stream = lambda *_a, **_k: _Stream()  # type: ignore[assignment]
    torch.cuda.default_stream = lambda *_a, **_k: _Stream()  # type: ignore[assignment]
    torch.cuda.stream = lambda *_a, **_k: _Stream()  # type: ignore[assignment]


# -- 9. the "CUDA" RNG ------------------------------------------------------------------------------------


def _cpu_backed_cuda_rng() -> None:
    # rerun_state_machine.py (every iteration), checkpointing.py (save and load) and megatron-core's RNG
    # tracker (tensor_parallel.random: add/fork, _get/_set_cuda_rng_state) read and write the CUDA RNG
    # state, which needs a driver. One extra CPU generator plays CUDA's default generator, so the saved
    # and restored states round-trip exactly (model-parallel regions still draw from the CPU generator).
    from megatron.core.tensor_parallel import random as tp_random

    def get_rng_state(device: object = "cuda") -> torch.Tensor:
        return _CUDA_RNG.get_state()

    def set_rng_state(new_state: torch.Tensor, device: object = "cuda") -> None:
        _CUDA_RNG.set_state(new_state.to("cpu", torch.uint8))

    def manual_seed(seed: int) -> None:
        _CUDA_RNG.manual_seed(int(seed))

    torch.cuda.get_rng_state = get_rng_state  # type: ignore[assignment]
    torch.cuda.set_rng_state = set_rng_state  # type: ignore[assignment]
    torch.cuda.get_rng_state_all = lambda: [get_rng_state()]  # type: ignore[assignment]
    torch.cuda.set_rng_state_all = lambda states: set_rng_state(states[0])  # type: ignore[assignment]
    torch.cuda.manual_seed = manual_seed  # type: ignore[assignment]
    torch.cuda.manual_seed_all = manual_seed  # type: ignore[assignment]
    torch.cuda.random.get_rng_state = get_rng_state  # type: ignore[assignment]
    torch.cuda.random.set_rng_state = set_rng_state  # type: ignore[assignment]
    tp_random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: get_rng_state()
    tp_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: set_rng_state(new_state)


# -- 10. checkpoint writer ----------------------------------------------------------------------------------


def _forked_write_queue() -> None:
    # filesystem_async.py:55 builds its write-results queue on a *spawned* multiprocessing.Manager,
    # which re-imports __main__ (the runner, without any shim above: EOFError). A forked one needs none.
    # lazy: longctx.mcore.checkpoint imports dist_checkpointing, which must load after the device shims
    from longctx.mcore.checkpoint import use_fork_write_queue

    use_fork_write_queue()


# -- 11. distributed optimizer ------------------------------------------------------------------------------


def _optimizer_step_zero() -> bool:
    # Without Apex/TE, DistributedOptimizer.state_dict (distrib_optimizer.py:642) asserts that the
    # torch Adam state holds exactly one `step`; before the first update it holds none, and every
    # resume builds that state dict before loading. It is computed as if at step 0 (the step only
    # fills the param groups' `step`, which loading overwrites).
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return False
    cls = distrib_optimizer.DistributedOptimizer
    orig = cls.state_dict

    @functools.wraps(orig)
    def state_dict(self: Any) -> Any:
        inner = self.optimizer
        if len(inner.state) > 0:
            return orig(self)
        real = inner.state_dict

        def at_step_zero() -> dict[str, Any]:
            sd = real()
            sd["state"] = {0: {"step": torch.tensor(0.0)}}
            return sd

        inner.state_dict = at_step_zero
        try:
            return orig(self)
        finally:
            del inner.state_dict

    cls.state_dict = state_dict
    return True


def _resume_with_torch_adam_steps() -> bool:
    # Loading a fully_reshardable save (distrib_optimizer.py:940) copies a source tensor into every entry
    # of the torch Adam state; without Apex/TE that state also holds `step`, which has no source tensor
    # (the step comes from the param groups, set just before): KeyError. The step entry is left alone.
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return False
    cls = distrib_optimizer.DistributedOptimizer
    orig = cls._set_main_param_and_optimizer_states

    @functools.wraps(orig)
    def set_states(self: Any, model_param: Any, tensors: dict[str, Any]) -> Any:
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return orig(self, model_param, tensors)

    # It also gives every parameter's state the *same* step tensor (distrib_optimizer.py:822), which torch's
    # AdamW then increments once per parameter: from the second resumed step on, the bias corrections are
    # those of a step count many times too high. Each state gets its own copy.
    load_orig = cls.load_state_dict

    @functools.wraps(load_orig)
    def load_state_dict(self: Any, state_dict: Any) -> Any:
        out = load_orig(self, state_dict)
        for st in self.optimizer.state.values():
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()
        return out

    cls._set_main_param_and_optimizer_states = set_states
    cls.load_state_dict = load_state_dict
    return True


# -- 12. device queries of TP > 1 / CP > 1 ---------------------------------------------------------------------


class _PretendDeviceProperties:
    """What torch.cuda.get_device_properties reports for the pretend device: an A100-class GPU (arch 8.0)."""

    name = "longctx pretend A100-class device (CPU)"
    major = 8
    minor = 0
    multi_processor_count = 108
    total_memory = 80 * 2**30
    is_integrated = False
    is_multi_gpu_board = False

    def __repr__(self) -> str:
        return f"_PretendDeviceProperties(name={self.name!r}, major={self.major}, minor={self.minor})"


def _pretend_ampere_device() -> None:
    # With TP > 1 or CP > 1, validate_args (arguments.py:928 at core_v0.16.1) asks get_device_arch_version()
    # = torch.cuda.get_device_properties("cuda:0").major, and below Blackwell (arch < 10) asserts
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:951); --moe-grouped-gemm asks get_device_capability()
    # (:853). The pretend device is an A100-class GPU (8.0), and the variable is set when unset (it only
    # orders CUDA kernel queues; a different value the user set is left for Megatron to refuse).
    import os

    torch.cuda.get_device_properties = lambda *_a, **_k: _PretendDeviceProperties()  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda *_a, **_k: (8, 0)  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *_a, **_k: _PretendDeviceProperties.name  # type: ignore[assignment]
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


SHIMS: list[tuple[str, Callable[[], object]]] = [
    ("batch_invariant_kernels_stub", _stub_batch_invariant_kernels),
    ("pretend_cuda_device", _pretend_cuda_device),
    ("dummy_streams", _dummy_streams),
    ("cpu_backed_cuda_rng", _cpu_backed_cuda_rng),
    ("allow_no_cuda", _allow_no_cuda),
    ("one_device_for_groups_and_seed", _one_device_for_groups_and_seed),
    ("skip_gpu_compilation", _skip_gpu_compilation),
    ("forked_write_queue", _forked_write_queue),
    ("optimizer_step_zero", _optimizer_step_zero),
    ("resume_with_torch_adam_steps", _resume_with_torch_adam_steps),
    ("pretend_ampere_device", _pretend_ampere_device),
]
