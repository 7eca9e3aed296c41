"""Point-to-point messages inside a process group, and the flat collectives of the all-gather variant.

`PeerExchange.post` sends and receives a batch of messages with any ranks of the group in one
`batch_isend_irecv`; the caller waits on the returned handle later, so transfers overlap compute.
Works on gloo (CPU) and NCCL. Gloo matches messages between two ranks per tag in posting order;
NCCL ignores tags and matches in posting order only, so every rank must post its batches in the
same sequence (the ring schedule guarantees it). Peers are given as group ranks and translated to
global ranks, because `P2POp` addresses the default group's numbering.
"""

from __future__ import annotations

from collections.abc import Sequence

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


class Pending:
    """Messages in flight; `wait()` returns once all of them are done (then their buffers are free)."""

    def __init__(self, works: Sequence[dist.Work] = ()) -> None:
        self._works = list(works)

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []


class PeerExchange:
    """Batches of sends and receives between this rank and any ranks of `group`."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) for r in range(self.world)]
        # gloo runs each send and receive on its own as soon as it is posted, so a batch only adds
        # bookkeeping (~0.3 ms per batch); NCCL needs the batch to pair sends with receives
        self._direct = dist.get_backend(group) == dist.Backend.GLOO

    def post(
        self,
        sends: Sequence[tuple[Tensor, int]],
        recvs: Sequence[tuple[Tensor, int]],
        tag: int = 0,
    ) -> Pending:
        """Start sending each `(tensor, group_rank)` of `sends` and receiving into those of `recvs`.

        Tensors must be contiguous and stay alive and untouched until the handle's `wait()`.
        """
        if self._direct:
            works = [dist.isend(t, self._global[p], self.group, tag) for t, p in sends]
            works += [dist.irecv(t, self._global[p], self.group, tag) for t, p in recvs]
            return Pending(works)
        ops = [dist.P2POp(dist.isend, t, self._global[p], self.group, tag) for t, p in sends]
        ops += [dist.P2POp(dist.irecv, t, self._global[p], self.group, tag) for t, p in recvs]
        return Pending(dist.batch_isend_irecv(ops) if ops else ())


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
