"""Every workaround megatron-core 0.16.1 needs to run on a machine without CUDA.

megatron-core assumes a GPU in a handful of places that have nothing to do with the maths. Each patch
below names the call it covers. `apply_cpu_compat()` is idempotent and, when CUDA is available, only
binds the one name megatron-core leaves undefined without TransformerEngine (the MoE router's GEMM);
GPU runs otherwise use megatron-core untouched.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

_lock = threading.Lock()
_applied = False


def cpu_only() -> bool:
    return not torch.cuda.is_available()


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU use. Returns True when patches are (now) active."""
    global _applied
    _patch_moe_router_without_te()
    if not cpu_only():
        return False
    with _lock:
        if _applied:
            return True
        _patch_torch_cuda_queries()
        _patch_rope()
        _patch_checkpoint_rng()
        # GlobalMemoryBuffer.get_tensor (megatron/core/utils.py) allocates on torch.cuda.current_device(),
        # covered by the first patch; tensor_parallel.random.model_parallel_cuda_manual_seed needs a
        # driver, so training seeds through `seed_model_parallel_rng` below instead.
        _applied = True
    return True


def _patch_moe_router_without_te() -> None:
    # moe_utils.RouterGatingLinearFunction tests `te_general_gemm is not None`, but the name is only bound
    # when TransformerEngine imports: without TE (every CPU, and GPUs without it) the MoE router's
    # forward raises NameError. Bound to None it takes its plain torch matmul path.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]


def _patch_torch_cuda_queries() -> None:
    # dist_checkpointing's saver calls torch.cuda.synchronize() after writes
    # (strategies/filesystem_async.py) and builds its failure flag on torch.cuda.current_device()
    # (strategies/state_dict_saver.py); rotary embeddings and GlobalMemoryBuffer place tensors on
    # torch.cuda.current_device(). On CPU the device is "cpu" and there is nothing to synchronize.
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]


def _patch_checkpoint_rng() -> None:
    # Activation recompute (tensor_parallel.checkpoint, CheckpointWithoutOutput) saves and restores
    # every RNG state around the recomputed forward, CUDA's included, through these two functions,
    # which need a driver. A CPU-only process has no CUDA generator: its state is an empty tensor and
    # restoring it does nothing (torch's CPU state and the tracker's are still saved and restored).
    from megatron.core.tensor_parallel import random as mp_random

    mp_random._get_cuda_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)  # type: ignore[assignment]
    mp_random._set_cuda_rng_state = lambda *a, **k: None  # type: ignore[assignment]


def _patch_rope() -> None:
    # RotaryEmbedding.get_emb moves inv_freq to torch.cuda.current_device() (covered above), and
    # rope_utils.get_pos_emb_on_this_cp_rank builds its chunk index with pin_memory=True + .cuda(),
    # which fails without a driver. The replacement selects the same zigzag chunks [r, 2·cp−1−r].
    from megatron.core.models.common.embeddings import rope_utils, rotary_pos_embedding

    def get_pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any) -> torch.Tensor:
        if cp_group is None:
            raise ValueError("cp_group must be provided to get positional embedding per CP rank")
        cp_size = cp_group.size()
        cp_rank = cp_group.rank()
        idx = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
        shaped = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1 :])
        picked = shaped.index_select(seq_dim, idx)
        return picked.view(*picked.shape[:seq_dim], -1, *picked.shape[seq_dim + 2 :])

    rope_utils.get_pos_emb_on_this_cp_rank = get_pos_emb_on_this_cp_rank
    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = get_pos_emb_on_this_cp_rank
    try:
        from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding

        yarn_rotary_pos_embedding.get_pos_emb_on_this_cp_rank = get_pos_emb_on_this_cp_rank
    except ImportError:  # pragma: no cover - older layouts
        pass


def seed_model_parallel_rng(seed: int) -> None:
    """Seed python/numpy/torch and megatron's RNG tracker the way training expects, on CPU or GPU."""
    import random

    import numpy as np
    from megatron.core import tensor_parallel

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        # The inference tracker forks the CPU generator instead of CUDA's; model-parallel regions then
        # draw from torch's default generator, which is what CPU initialisation uses anyway.
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


@functools.cache
def megatron_core_version() -> str:
    from megatron.core import package_info

    return str(package_info.__version__)
