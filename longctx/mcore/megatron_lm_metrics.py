"""What Megatron-LM's `pretrain_gpt.py` measured, in the stage's metrics.jsonl (the local trainer's schema).

longctx's runner (`python -m longctx.mcore.run_megatron_lm`) calls `record_metrics(path, stage)` before the
script starts when the launch asks for it ($LONGCTX_METRICS_FILE, set by `stage run` for `longctx
rehearse`). Two functions of `megatron.training.training` are wrapped; the checkout is never edited:

- `get_model`: the process's peak memory before the model is noted; on the model it returns, the RoPE base
  is read back from the rotary embedding's inverse frequencies (what the engine built, not what the argv
  said), and a forward hook on that embedding notes the largest position whose angles it hands to the
  attention (after the CP split: each rank sees its own chunks).
- `train_step`: each step is timed; after it, the loss Megatron reduced over the group, the LR the step
  ran at, the gradient norm, and the largest position and peak memory over all ranks (one all-reduce) go
  to the metrics file from rank 0, one line per iteration (`longctx.mcore.metrics`).

Idempotent; nothing is wrapped without the environment variable, so a cluster launch runs untouched.
"""

from __future__ import annotations

import atexit
import functools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from longctx.mcore.metrics import IterationMetrics, MetricsWriter, peak_memory_bytes, start_memory_peak
from longctx.mcore.positions import built_rotary_base

_recorder: _Recorder | None = None


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _modules(chunks: object) -> Iterable[torch.nn.Module]:
    for chunk in chunks if isinstance(chunks, list | tuple) else [chunks]:
        if isinstance(chunk, torch.nn.Module):
            yield from chunk.modules()


def _learning_rate(optimizer: object) -> float | None:
    groups = getattr(optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


def _loss(loss_dict: object) -> float:
    """The step's loss as Megatron reduced it ('lm loss'), -inf on a rank without one (not the last PP stage)."""
    if not isinstance(loss_dict, dict) or not loss_dict:
        return -math.inf
    value = loss_dict.get("lm loss", next(iter(loss_dict.values())))
    return float(value.item() if isinstance(value, torch.Tensor) else value)


class _Recorder:
    def __init__(self, path: Path, stage: str) -> None:
        self.path, self.stage = path, stage
        self.writer: MetricsWriter | None = None
        self.memory_before = 0
        self.rotary_base_built: float | None = None
        self.max_position = 0
        self.t_last: float | None = None

    # -- the model ------------------------------------------------------------------------------------
    def wrap_get_model(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def get_model(*args: Any, **kwargs: Any) -> Any:
            self.memory_before = start_memory_peak(_device())  # the process before the model
            model = orig(*args, **kwargs)
            self._model_built(model)
            return model

        return get_model

    def _model_built(self, chunks: object) -> None:
        for m in _modules(chunks):
            rotary = getattr(m, "rotary_pos_emb", None)
            if isinstance(rotary, torch.nn.Module) and not getattr(rotary, "_longctx_metrics", False):
                self.rotary_base_built = self.rotary_base_built or built_rotary_base(m)  # type: ignore[arg-type]
                rotary.register_forward_hook(self._positions)
                rotary._longctx_metrics = True

    def _positions(self, module: Any, _args: object, output: object) -> None:
        # the angles of position p in the first rotary pair are p · inv_freq[0] (/ interpolation factor)
        emb = output[0] if isinstance(output, tuple) else output
        if not isinstance(emb, torch.Tensor) or emb.numel() == 0:
            return
        factor = getattr(module, "seq_len_interpolation_factor", None) or 1.0
        first = float(module.inv_freq.reshape(-1)[0])
        top = float(emb.detach().reshape(emb.shape[0], -1)[:, 0].max()) / first * factor
        self.max_position = max(self.max_position, round(top))

    # -- one step -------------------------------------------------------------------------------------
    def wrap_train_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def train_step(*args: Any, **kwargs: Any) -> Any:
            optimizer = args[3] if len(args) > 3 else kwargs.get("optimizer")
            lr = _learning_rate(optimizer)
            start = time.perf_counter()
            self.t_last = self.t_last or start
            out = orig(*args, **kwargs)
            now = time.perf_counter()
            self._record(out, lr, now - start, now)
            return out

        return train_step

    def _record(self, out: tuple[Any, ...], lr: float | None, step: float, now: float) -> None:
        from megatron.training.global_vars import get_args  # the checkout's, on sys.path by now

        args = get_args()
        grown = peak_memory_bytes(_device()) - self.memory_before
        top = torch.tensor([float(self.max_position), float(grown), _loss(out[0])], dtype=torch.float64)
        if dist.is_initialized():
            top = top.to(_device())
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
        max_position, peak, loss = (float(x) for x in top.tolist())
        dt, self.t_last = now - (self.t_last or now), now
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        if self.writer is None:
            self.writer = MetricsWriter(self.path)
            atexit.register(self.writer.close)
        tokens = args.global_batch_size * args.seq_length
        grad_norm = out[5] if len(out) > 5 else None
        self.writer.write(
            IterationMetrics(
                stage=self.stage,
                iteration=int(args.curr_iteration) + 1,
                loss=loss,
                lr=lr,
                grad_norm=None if grad_norm is None else float(grad_norm),
                tokens_per_s=tokens / dt if dt > 0 else 0.0,
                # the loop adds this step's samples after train_step returns
                consumed_samples=int(args.consumed_train_samples) + int(args.global_batch_size),
                seconds=dt,
                step_seconds=step,
                max_position=int(max_position),
                peak_growth_bytes=int(peak),
                rotary_base_built=self.rotary_base_built,
            )
        )


def record_metrics(path: Path, stage: str) -> bool:
    """Wrap Megatron-LM's get_model and train_step to write `path` (False: already wrapped)."""
    global _recorder
    if _recorder is not None:
        return False
    from megatron.training import training  # the checkout's, on sys.path by now

    _recorder = _Recorder(path, stage)
    training.get_model = _recorder.wrap_get_model(training.get_model)
    training.train_step = _recorder.wrap_train_step(training.train_step)
    return True


__all__ = ["record_metrics"]
