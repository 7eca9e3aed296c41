"""torch.distributed and megatron-core's model-parallel state, set up the same way for training and
evaluation: NCCL on GPU, gloo on CPU, with the CPU shims applied first.

- `init_training_parallel(tp, cp, seed)`: the launcher's world (or a one-process world of its own)
  split into TP × CP × DP; kept for the life of the process, as Megatron-LM does.
- `eval_parallel(cp)`: a context that reuses whatever state exists or creates a private one and
  tears down only what it created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from longctx.errors import ParallelError
from longctx.mcore.cpu import apply_cpu_compat, seed_model_parallel_rng
from longctx.util.net import free_port

# CUDA_VISIBLE_DEVICES values that hide every GPU on purpose
_HIDDEN = ("", "-1")


def cuda_unusable_reason(
    env: Mapping[str, str], nvidia_visible: bool, cuda_built: bool, cuda_available: bool
) -> str | None:
    """Why this process would compute on CPU although the machine has an NVIDIA GPU (None: it will not).

    A driver too old for torch's CUDA, or a CPU-only torch, makes `torch.cuda.is_available()` false;
    training then falls back to CPU, gloo and fp32 and runs a hundred times slower without saying so.
    Hiding the GPUs (CUDA_VISIBLE_DEVICES="") is how a user asks for CPU on a GPU machine."""
    if cuda_available or not nvidia_visible or env.get("CUDA_VISIBLE_DEVICES", None) in _HIDDEN:
        return None
    if not cuda_built:
        return f"this torch ({torch.__version__}) is a CPU-only build, and the machine has an NVIDIA GPU"
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the NVIDIA GPU this machine "
        "has (torch.cuda.is_available() is false: usually a driver older than that CUDA)"
    )


def _nvidia_visible() -> bool:
    dev = Path("/dev")
    return (dev / "nvidiactl").exists() or any(dev.glob("nvidia[0-9]*"))


def uses_cuda() -> bool:
    """Whether this process computes on CUDA; refuses a visible NVIDIA GPU torch cannot use."""
    if torch.cuda.is_available():
        return True
    reason = cuda_unusable_reason(os.environ, _nvidia_visible(), torch.version.cuda is not None, False)
    if reason is not None:
        raise ParallelError(
            reason,
            where=f"torch {torch.__version__} in {Path(torch.__file__).parent}",
            fix="install the torch build for this driver's CUDA (or update the driver); to train on CPU "
            "on purpose, hide the GPUs with CUDA_VISIBLE_DEVICES=''",
        )
    return False


def backend() -> str:
    return "nccl" if uses_cuda() else "gloo"


def training_device() -> torch.device:
    """CUDA (this rank's GPU, see `init_training_parallel`) or CPU."""
    return torch.device("cuda") if uses_cuda() else torch.device("cpu")


def backend_device(backend_name: str) -> torch.device:
    """Where a collective's tensors must live for a process-group backend: NCCL has no CPU path."""
    return torch.device("cuda") if backend_name == "nccl" else torch.device("cpu")


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device for tensors reduced over `group` (the default group when None)."""
    return backend_device(str(dist.get_backend(group)))


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or a plain process: the one that writes files and prints."""
    return int(os.environ.get("RANK", "0")) == 0


def check_local_rank(local_rank: int, device_count: int) -> None:
    """One GPU per rank: NCCL refuses two ranks on one GPU, and rank N needs GPU N."""
    if local_rank >= device_count:
        raise ParallelError(
            f"local rank {local_rank} has no GPU of its own: this node shows {device_count} GPU(s), and "
            "NCCL cannot run two ranks on one GPU",
            where="LOCAL_RANK / the launch's processes per node",
            fix=f"launch at most {device_count} process(es) per node (TP × CP × DP per node ≤ GPUs), or "
            "train on CPU with CUDA_VISIBLE_DEVICES=''",
        )


# Overrides the device count `check_ranks_fit` compares a launch with (an integer): lets a CPU machine
# take the decision a node with that many GPUs would take.
DEVICE_COUNT_ENV = "LONGCTX_DEVICE_COUNT"


def visible_device_count(env: Mapping[str, str] | None = None) -> int | None:
    """GPUs each rank of this node can have (None: no limit, CPU ranks); `DEVICE_COUNT_ENV` overrides."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES", None) in _HIDDEN:  # CPU ranks on purpose, whatever the machine has
        return None
    override = env.get(DEVICE_COUNT_ENV)
    if override is not None:
        try:
            return int(override)
        except ValueError:
            raise ParallelError(
                f"{DEVICE_COUNT_ENV}={override!r} is not an integer",
                where="the environment",
                fix=f"set {DEVICE_COUNT_ENV} to the number of GPUs, or unset it",
            ) from None
    return torch.cuda.device_count() if uses_cuda() else None


def check_ranks_fit(env: Mapping[str, str], device_count: int | None) -> None:
    """Refuse, on every rank and before any process group exists, a launch with more ranks on this node
    than GPUs. Checked later, only the ranks without a GPU would stop, and the others would wait in
    the process-group set-up for them (10–30 minutes) before failing."""
    if device_count is None:
        return
    local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    if local_world > device_count:
        raise ParallelError(
            f"this launch starts {local_world} process(es) on this node, which shows {device_count} GPU(s): "
            "each rank needs a GPU of its own (NCCL cannot run two ranks on one GPU)",
            where=f"LOCAL_WORLD_SIZE={local_world} (rank {env.get('RANK', '0')})",
            fix=f"launch at most {device_count} process(es) per node (TP × CP × DP per node ≤ GPUs, e.g. CP 1), "
            "or train on CPU ranks with CUDA_VISIBLE_DEVICES=''",
        )


def _set_local_device() -> None:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        check_local_rank(local, torch.cuda.device_count())
        torch.cuda.set_device(local)


def init_training_parallel(tensor_parallel: int, context_parallel: int, seed: int) -> None:
    """Process group + TP/CP/DP groups for training, then the seeded RNG streams megatron expects."""
    apply_cpu_compat()
    if not dist.is_initialized():
        check_ranks_fit(os.environ, visible_device_count())
        if "RANK" not in os.environ:  # a single process without torchrun
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group(backend())
    _set_local_device()
    world = dist.get_world_size()
    group = tensor_parallel * context_parallel
    if world % group:
        raise ParallelError(
            f"world size {world} is not a multiple of TP × CP = {group}", fix="launch TP × CP × DP processes"
        )
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel, context_parallel_size=context_parallel
        )
    seed_model_parallel_rng(seed)


def teardown_training_parallel() -> None:
    """Undo `init_training_parallel`. A process group left to the interpreter's exit can abort it
    ("terminate called without an active exception", exit 134) after all its work succeeded."""
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class EvalParallel:
    cp: int
    rank: int  # rank in the CP group (= global rank: evaluation runs CP ranks only)
    group: dist.ProcessGroup | None  # the CP process group (None at CP = 1)
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _check_existing_model_parallel(cp: int) -> None:
    have = ps.get_context_parallel_world_size()
    if have != cp or ps.get_tensor_model_parallel_world_size() != 1:
        raise ParallelError(
            f"model-parallel state is already set up with CP = {have}, "
            f"TP = {ps.get_tensor_model_parallel_world_size()}; evaluation asked CP = {cp}, TP = 1",
            fix="evaluate in a fresh process",
        )


@contextlib.contextmanager
def eval_parallel(cp: int = 1) -> Iterator[EvalParallel]:
    """torch.distributed + megatron model-parallel state for an evaluation with CP = `cp`.

    Single process: a private gloo group on an in-memory store (no port, no environment variables
    changed, so processes launched later from the same process are unaffected). Under torchrun:
    the launcher's world, which must hold exactly `cp` ranks. Whatever this creates is destroyed
    on exit; state that already existed (a trainer's, a test's) is reused and left alone.
    """
    if cp < 1:
        raise ParallelError(
            f"context-parallel size must be ≥ 1, got {cp}",
            where="--cp",
            fix="pass --cp 1 (or a larger CP size)",
        )
    apply_cpu_compat()
    made_pg = made_mp = False
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
            check_ranks_fit(os.environ, visible_device_count())
            dist.init_process_group(backend())
        else:
            dist.init_process_group(backend(), store=dist.HashStore(), rank=0, world_size=1)
        made_pg = True
    try:
        world = dist.get_world_size()
        if world != cp:
            raise ParallelError(
                f"evaluation with CP = {cp} needs exactly {cp} process(es); this world has {world}",
                fix=f"launch with torchrun --nproc-per-node {cp}, or pass --cp {world}",
            )
        _set_local_device()
        if ps.model_parallel_is_initialized():
            _check_existing_model_parallel(cp)
        else:
            ps.initialize_model_parallel(tensor_model_parallel_size=1, context_parallel_size=cp)
            made_mp = True
        group = ps.get_context_parallel_group() if cp > 1 else None
        rank = ps.get_context_parallel_rank() if cp > 1 else 0
        device = training_device()
        yield EvalParallel(cp=cp, rank=rank, group=group, device=device)
    finally:
        if made_mp:
            ps.destroy_model_parallel()
        if made_pg:
            dist.destroy_process_group()
