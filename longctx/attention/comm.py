"""Ring point-to-point exchange: send a buffer to the next rank, receive the previous rank's.

One `batch_isend_irecv` per exchange, started before the block compute and waited after it, so the
transfer overlaps the kernel. Works on gloo (CPU) and NCCL; peers are translated to global ranks
because `P2POp` addresses the default group's numbering.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def group_size(group: dist.ProcessGroup | None) -> int:
    """Size of `group`; 1 when there is no group (single process) or distributed is not initialised."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


class RingComm:
    """Exchanges with the ring neighbours of this rank inside `group`."""

    def __init__(self, group: dist.ProcessGroup, tag: int = 0) -> None:
        self.group = group
        self.tag = tag
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.next_rank = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev_rank = dist.get_global_rank(group, (self.rank - 1) % self.world)
        self._pending: list[dist.Work] = []

    def start(self, send: list[Tensor], recv: list[Tensor]) -> None:
        """Begin sending `send` to the next rank and receiving `recv` from the previous one.

        The tensors must stay alive and untouched until `wait()`; `send` must be contiguous.
        """
        if self._pending:
            raise RuntimeError("RingComm.start called while an exchange is still in flight")
        ops = [dist.P2POp(dist.isend, t, self.next_rank, self.group, self.tag) for t in send]
        ops += [dist.P2POp(dist.irecv, t, self.prev_rank, self.group, self.tag) for t in recv]
        self._pending = list(dist.batch_isend_irecv(ops))

    def wait(self) -> None:
        for work in self._pending:
            work.wait()
        self._pending = []


# torch ≥ 2.13 renames the flat collectives (the old names warn); older torch only has the old ones.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_dim0(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """`[world, *x.shape]` holding every rank's `x` in group-rank order (gloo- and NCCL-safe form)."""
    world = dist.get_world_size(group)
    flat = x.contiguous().view(-1)
    out = torch.empty(world * flat.numel(), dtype=x.dtype, device=x.device)
    _all_gather_single(out, flat, group=group)
    return out.view(world, *x.shape)


def reduce_scatter_dim0(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Sum `x[world, ...]` over ranks and return this rank's slice `x[rank]` of the sum."""
    world = dist.get_world_size(group)
    if x.shape[0] != world:
        raise ValueError(f"reduce_scatter_dim0 wants a leading dim of {world}, got {tuple(x.shape)}")
    flat = x.contiguous().view(-1)
    out = torch.empty(flat.numel() // world, dtype=x.dtype, device=x.device)
    _reduce_scatter_single(out, flat, group=group)
    return out.view(*x.shape[1:])
