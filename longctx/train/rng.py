"""The random state a checkpoint carries, in Megatron-LM's layout, so either backend can resume it.

Megatron-LM saves one ShardedObject `rng_state` per (PP, TP) rank holding a list with one dict:
python, numpy and torch states, the CUDA default generator, and the states of its CUDA RNG tracker
(`model-parallel-rng`, `data-parallel-rng`, `expert-parallel-rng`); on resume it refuses a save
without tracker states ("Unable to load rng state", exit 0). On a GPU the local trainer saves the real
ones. On the CPU it has no CUDA generators: it saves CPU generators seeded as megatron-core seeds
the tracker (which Megatron-LM's CPU runner backs with CPU generators too). With dropout 0, as in
every longctx plan, nothing draws from them during training.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

# megatron-core's model_parallel_cuda_manual_seed: offsets of the tracker's streams from the seed
_TRACKER_SEEDS = {"model-parallel-rng": 2718, "data-parallel-rng": 0, "expert-parallel-rng": 1024}


def _cpu_generator_state(seed: int) -> torch.Tensor:
    return torch.Generator().manual_seed(seed).get_state()


def _tracker_states(seed: int) -> dict[str, torch.Tensor]:
    if torch.cuda.is_available():
        states = tensor_parallel.get_cuda_rng_tracker().get_states()
        if states:
            return {k: v.clone() for k, v in states.items()}
    tp_rank = ps.get_tensor_model_parallel_rank()
    return {
        name: _cpu_generator_state(seed + offset + (tp_rank if name != "data-parallel-rng" else 0))
        for name, offset in _TRACKER_SEEDS.items()
    }


def rng_sharded_object(seed: int) -> ShardedObject:
    """This rank's random state as Megatron-LM saves it (replicated over DP × CP)."""
    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state()
        if torch.cuda.is_available()
        else _cpu_generator_state(seed),
        "rng_tracker_states": _tracker_states(seed),
    }
    return ShardedObject(
        "rng_state",
        [state],
        (1, ps.get_tensor_model_parallel_world_size()),
        (0, ps.get_tensor_model_parallel_rank()),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def restore_rng(loaded: Any) -> None:
    """Set the states `rng_sharded_object`'s template loaded (a list of one dict, or the dict)."""
    state = loaded[0] if isinstance(loaded, list) else loaded
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if not torch.cuda.is_available():
        return
    cuda_state = state.get("cuda_rng_state")
    # a save made on the CPU carries CPU generator states, which a CUDA generator cannot take
    if isinstance(cuda_state, torch.Tensor) and cuda_state.numel() == torch.cuda.get_rng_state().numel():
        torch.cuda.set_rng_state(cuda_state)
        tracker = state.get("rng_tracker_states")
        if tracker:
            tensor_parallel.get_cuda_rng_tracker().set_states(tracker)
