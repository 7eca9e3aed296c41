"""The local trainer: megatron-core GPTModel, AdamW, Megatron's schedule, DP × CP over torch.distributed.

Read top to bottom: set up the process groups, build the model, load (resume or weights-only), then
step until the stage's iterations are done or an exit is asked for, saving as Megatron-LM does.

Loss and gradients follow Megatron's per-token semantics: the loss of a global batch is the sum of
token losses over every micro batch, data-parallel and context-parallel rank, divided by the number
of loss tokens; gradients are summed over the DP × CP group (each rank already divided by the global
token count), so CP = 2 gives the gradient of the same full-sequence loss as CP = 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core import parallel_state as ps
from torch.distributed.checkpoint.api import CheckpointException

from longctx.attention.megatron_adapter import document_params
from longctx.checkpoint.save_layout import read_tracker
from longctx.diffusion.loss import mdm_token_loss, udm_token_loss
from longctx.errors import LongctxError, TrainError
from longctx.mcore.attention_scale import scale_attention_logits
from longctx.mcore.checkpoint import common_strategy, load_common_state, save_checkpoint
from longctx.mcore.metrics import IterationMetrics, MetricsWriter, peak_memory_bytes, start_memory_peak
from longctx.mcore.model import ModelSettings, build_gpt_model, cp_exchanges
from longctx.mcore.parallel import collective_device, init_training_parallel, training_device
from longctx.mcore.positions import built_rotary_base, rope_from_position_ids
from longctx.mcore.stored_layout import StoredLayout, read_layout
from longctx.train import optim, signals
from longctx.train.data import (
    MicroBatch,
    NoiseSource,
    TrainDataset,
    build_train_dataset,
    global_batch_indices,
    micro_batch,
)
from longctx.train.events import TrainingEvents
from longctx.train.optim import build_optimizer, sharded_state_dict
from longctx.train.precision import MainParams, fp32_template, load_weights
from longctx.train.rng import restore_rng, rng_sharded_object
from longctx.train.schedule import LRScheduler
from longctx.train.spec import TrainSpec
from longctx.util.disk import os_error_in, storage_problem
from longctx.util.oserrors import file_system_error

EXIT_OK = 0
EXIT_REFUSED = 2


@dataclass
class RunResult:
    start_iteration: int
    end_iteration: int
    reason: str  # "done" | "signal" | "duration" | "interval"
    losses: list[float]


def _log(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            signals.output_gone()  # its launcher is gone: save and exit all the same, unheard


class Trainer:
    """One stage on this process: set up (process groups, model, optimizer), load, then step until the
    stage's iterations are done or an exit is asked for; `save` writes Megatron-LM's checkpoint layout."""

    # -- set up --------------------------------------------------------------------------------
    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        self.memory_before = start_memory_peak(training_device())  # the process before the model
        if spec.threads_per_process:
            torch.set_num_threads(spec.threads_per_process)
        self.device = training_device()
        init_training_parallel(spec.tensor_parallel, spec.context_parallel, spec.seed)
        self.bf16 = self.device.type == "cuda" if spec.bf16 is None else spec.bf16
        self.settings = self._model_settings()
        # RoPE from the batch's position ids: right on every CP rank of either split, and reset per
        # document with reset_position_ids
        self.model = rope_from_position_ids(build_gpt_model(spec.arch, self.settings).to(self.device))
        # what the engine built, read back from the model (the metrics hold it beside the plan's base)
        self.rotary_base_built = built_rotary_base(self.model)
        self.max_position = 0  # the largest position id RoPE was given in this launch, all ranks
        # bf16: the optimizer steps fp32 masters, gradients accumulate and reduce in fp32
        self.main = MainParams(self.model.parameters())
        self.optimizer = build_optimizer(self.main.masters, spec.lr)
        self.model_params = optim.model_order(self.optimizer, self.main.masters, self.main.model_params)
        self.scheduler = LRScheduler(spec.lr)
        self.iteration = 0
        self.consumed = 0
        self.dp = ps.get_data_parallel_world_size()
        self.dp_rank = ps.get_data_parallel_rank()
        self.cp = ps.get_context_parallel_world_size()
        self.cp_rank = ps.get_context_parallel_rank()
        self.reduce_group = ps.get_data_parallel_group(with_context_parallel=True)
        self.reduce_device = collective_device(self.reduce_group)
        self.dataset: TrainDataset | None = None  # built by `run`, once it knows there is work left
        self.events: TrainingEvents | None = None  # rank 0's TensorBoard/W&B record, open during `run`
        # the keys and buffers of the checkpoint loaded, kept for every save (GPTModel's for a fresh model)
        self.layout = StoredLayout()

    def _model_settings(self) -> ModelSettings:
        spec = self.spec
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        return ModelSettings(
            seq_length=spec.seq_length,
            rotary_base=spec.rotary_base,
            padded_vocab_size=spec.padded_vocab_size,
            tensor_model_parallel_size=spec.tensor_parallel,
            context_parallel_size=spec.context_parallel,
            params_dtype=dtype,
            recompute=None if spec.recompute == "none" else spec.recompute,
            recompute_method=spec.recompute_method,
            recompute_num_layers=spec.recompute_num_layers,
            attention=spec.attention,
            cp_comm=spec.cp_comm,
            causal=spec.objective.causal,
            output_vocab_size=spec.output_vocab_size,
        )

    # -- load ----------------------------------------------------------------------------------
    def load(self) -> str:
        """Resume from `save` when it has a checkpoint, else load `pretrained` weights, else random."""
        save = Path(self.spec.save)
        tracker = read_tracker(save) if save.is_dir() else None
        if tracker is not None:
            self._resume(save / tracker.dir_name)
            return f"resumed from {save / tracker.dir_name} at iteration {self.iteration}"
        if self.spec.pretrained:
            pre = Path(self.spec.pretrained)
            pre_tracker = read_tracker(pre) if pre.is_dir() else None
            if pre_tracker is None:
                raise TrainError(
                    f"no checkpoint tracker in the previous stage {pre}",
                    where=str(pre),
                    fix="finish the previous stage first (or adopt the base checkpoint)",
                )
            src = pre / pre_tracker.dir_name
            self.layout = read_layout(src)
            load_weights(self.main, self.model, src, self.layout.model_state(self.model))
            loaded = f"loaded weights from {src} (finetune: iteration 0, fresh optimizer)"
            if self.spec.attention_scale == 1.0:
                return loaded
            masters = (
                dict(zip(self.main.model_params, self.main.masters, strict=True)) if self.main.mixed else None
            )
            scale_attention_logits(self.model, self.spec.attention_scale, masters)
            return f"{loaded}; attention logits × {self.spec.attention_scale:.4g} (folded into the query weights)"
        return "random initialisation"

    def _resume(self, ckpt: Path) -> None:
        """Model, optimizer, counters, LR schedule and random state of checkpoint `ckpt` — saved by this
        backend or by Megatron-LM (see `longctx.train.optim` for the optimizer layouts it reads)."""
        common = load_common_state(ckpt)
        layout = optim.layout_of(common, str(ckpt))
        self.layout = read_layout(ckpt)
        model_sd = self.layout.model_state(self.model)
        template = {
            # bf16: the stored weights load as fp32, so a save without fp32 masters seeds them unrounded
            "model": fp32_template(model_sd) if self.main.mixed else model_sd,
            "optimizer": optim.template(self.optimizer, model_sd, layout, self.model_params),
            "rng_state": rng_sharded_object(self.spec.seed),
        }
        state = dist_checkpointing.load(template, str(ckpt), common_strategy=common_strategy(ckpt))
        model_state = {k: v for k, v in state["model"].items() if not k.endswith("_extra_state")}
        self.model.load_state_dict(model_state, strict=False)
        if self.main.mixed:
            self.main.set_masters_from_state(self.model, model_state)
        # the save's fp32 masters where it has them: its bf16 model tensors are rounded copies
        masters = optim.load(self.optimizer, state["optimizer"], layout)
        in_order = optim.parameters(self.optimizer)
        self.main.set_masters((in_order[i], value) for i, value in masters.items())
        self.iteration = int(common["iteration"])
        self.consumed = int(
            getattr(common["args"], "consumed_train_samples", self.iteration * self.spec.global_batch_size)
        )
        self.scheduler.load_megatron_state(common["opt_param_scheduler"], self.spec.global_batch_size)
        restore_rng(state["rng_state"])

    # -- one step ------------------------------------------------------------------------------
    def train_step(self) -> tuple[float, float]:
        """One global batch: forward/backward per micro batch, gradients summed over DP × CP, clip,
        AdamW step. Returns (the batch's per-token loss, the gradient norm before clipping)."""
        spec = self.spec
        device = self.device
        lr = self.scheduler.current_lr
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        batches = self._micro_batches()
        self.max_position = max(self.max_position, *(int(b.position_ids.max()) for b in batches))
        n_tokens = self._all_sum(sum(float(b.loss_mask.sum()) for b in batches))
        self.main.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: one sync
        for b in batches:
            token_loss = self._token_loss_sum(b)
            (token_loss / n_tokens).backward()
            loss_sum += token_loss.detach()
        self._sum_gradients()
        total = self._all_sum(float(loss_sum))
        grad_norm = self.main.clip_grad_norm(spec.lr.clip_grad, ps.get_tensor_model_parallel_group())
        self.optimizer.step()
        self.main.copy_to_model()
        self.scheduler.step()
        self.iteration += 1
        self.consumed += spec.global_batch_size
        return total / n_tokens, grad_norm

    def _token_loss_sum(self, b: MicroBatch) -> torch.Tensor:
        """Σ over the loss tokens of micro batch `b` of the objective's per-token loss (fp32)."""
        spec, device, obj = self.spec, self.device, self.spec.objective
        packed = None
        if b.cu_seqlens is not None:  # attention within documents (longctx attention only)
            packed = document_params(b.cu_seqlens.to(device), spec.seq_length, split=b.split)
        inputs = (b.tokens.to(device), b.position_ids.to(device), None)
        if obj.kind == "udm":  # the bound needs the whole distribution, not the CE of one token
            logits = self.model(*inputs, packed_seq_params=packed)
            per_token = udm_token_loss(obj, logits, b.labels, b.tokens, b.t, spec.tokenizer.vocab_size)
        else:
            per_token = self.model(*inputs, labels=b.labels.to(device), packed_seq_params=packed).float()
            if obj.kind == "mdm":
                per_token = mdm_token_loss(obj, per_token, b.corrupted, b.t)
        return (per_token * b.loss_mask.to(device)).sum()

    def _micro_batches(self) -> list[MicroBatch]:
        """This rank's micro batches of the global batch starting at `consumed` (its CP shard of each)."""
        spec = self.spec
        eod = spec.tokenizer.eod_id if spec.packing == "documents" else None
        noise = None
        if not spec.objective.causal:
            noise = NoiseSource(spec.objective, spec.seed, spec.global_batch_size, spec.tokenizer.vocab_size)
        return [
            micro_batch(
                self.dataset,
                idx,
                self.cp_rank,
                self.cp,
                documents_eod=eod,
                reset_position_ids=spec.reset_position_ids,
                noise=noise,
                causal=spec.objective.causal,
                split=None if spec.cp_split == "auto" else spec.cp_split,
            )
            for idx in global_batch_indices(
                self.consumed, spec.global_batch_size, spec.micro_batch_size, self.dp, self.dp_rank
            )
        ]

    def _all_sum(self, value: float) -> float:
        """`value` summed over the DP × CP group (in float64, on the group's device: NCCL has no CPU)."""
        t = torch.tensor([value], dtype=torch.float64, device=self.reduce_device)
        dist.all_reduce(t, group=self.reduce_group)
        return float(t.item())

    def _all_max(self, *values: int) -> list[int]:
        """Each of `values`, the largest over the DP × CP group."""
        t = torch.tensor(values, dtype=torch.float64, device=self.reduce_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.reduce_group)
        return [int(x) for x in t.tolist()]

    def _sum_gradients(self) -> None:
        """Sum the (fp32) gradients over the DP × CP group, in one flat all-reduce."""
        grads = self.main.grads()
        if self.dp * self.cp > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.reduce_group)
            for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                g.copy_(synced)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Load, then step until done or asked to exit; saves every `save_interval`, at the end and before an exit."""
        spec = self.spec
        signals.install()
        how = self.load()
        # the exchange the attention layers dispatch on, read from the model: proof the plan's choice arrived
        exchange = f" via {'/'.join(sorted(cp_exchanges(self.model)))}" if self.cp > 1 else ""
        _log(
            f"[longctx] stage {spec.stage}: {how}; target {spec.train_iters} iterations "
            f"(seq {spec.seq_length}, rotary base {spec.rotary_base:,}, DP {self.dp}, CP {self.cp}{exchange})"
        )
        start = self.iteration
        losses: list[float] = []
        if self.iteration >= spec.train_iters:
            return RunResult(start, self.iteration, "done", losses)
        self.dataset = build_train_dataset(spec)
        self.model.train()
        metrics, self.events = None, None
        if spec.metrics_file and dist.get_rank() == 0:
            metrics = MetricsWriter(Path(spec.metrics_file))
        if spec.tensorboard_dir and dist.get_rank() == 0:
            self.events = TrainingEvents(
                spec.tensorboard_dir, spec.wandb, config=spec.model_dump(mode="json")
            )
            if self.events.wandb_note:
                _log(f"[longctx] {self.events.wandb_note}")
        reason = "done"
        t_last = time.perf_counter()
        try:
            while self.iteration < spec.train_iters:
                lr = self.scheduler.current_lr
                step_start = time.perf_counter()
                loss, gnorm = self.train_step()
                losses.append(loss)
                now = time.perf_counter()
                dt, t_last = now - t_last, now
                self._report(metrics, loss, lr, gnorm, dt, now - step_start)
                exit_reason = self._exit_reason()
                finished = self.iteration >= spec.train_iters
                if exit_reason is not None or self.iteration % spec.save_interval == 0 or finished:
                    path = self.save()
                    _log(f"[longctx] saved {path}")
                if finished:
                    break
                if exit_reason is not None:
                    reason = exit_reason
                    _log(f"[longctx] exiting after iteration {self.iteration} ({reason}); relaunch to resume")
                    break
        finally:
            if metrics is not None:
                metrics.close()
            if self.events is not None:
                self.events.close()
        return RunResult(start, self.iteration, reason, losses)

    def _report(
        self, metrics: MetricsWriter | None, loss: float, lr: float, gnorm: float, dt: float, step: float
    ) -> None:
        """One JSON line per iteration to the metrics file; a log line every `log_interval` and at the end.
        `dt`: since the last iteration's report (a save in between included); `step`: the step alone."""
        spec = self.spec
        tokens_per_iter = spec.global_batch_size * spec.seq_length
        grown = peak_memory_bytes(self.device) - self.memory_before
        max_position, peak = self._all_max(self.max_position, grown)
        if metrics is not None:
            metrics.write(
                IterationMetrics(
                    stage=spec.stage,
                    iteration=self.iteration,
                    loss=loss,
                    lr=lr,
                    grad_norm=gnorm,
                    tokens_per_s=tokens_per_iter / dt,
                    consumed_samples=self.consumed,
                    seconds=dt,
                    step_seconds=step,
                    max_position=max_position,
                    peak_growth_bytes=peak,
                    rotary_base_built=self.rotary_base_built,
                )
            )
        if self.events is not None:
            self.events.iteration(
                self.iteration,
                self.consumed,
                loss=loss,
                lr=lr,
                grad_norm=gnorm,
                batch_size=spec.global_batch_size,
                seconds=dt,
                tokens_per_second=tokens_per_iter / dt,
            )
        if self.iteration % spec.log_interval == 0 or self.iteration == spec.train_iters:
            _log(
                f"[longctx] {spec.stage} iteration {self.iteration}/{spec.train_iters} loss {loss:.4f} "
                f"lr {lr:.3e} grad-norm {gnorm:.3f} tokens/s {tokens_per_iter / dt:,.0f}"
            )

    def _exit_reason(self) -> str | None:
        """Why this launch stops after this iteration ("signal", "duration", "interval"), or None; every
        rank agrees (a signal or the time limit seen by one rank stops them all here)."""
        spec = self.spec
        want_signal = signals.agree(signals.received() is not None)
        over_time = spec.exit_duration_in_mins is not None and signals.agree(
            signals.elapsed_minutes() >= spec.exit_duration_in_mins
        )
        at_interval = spec.exit_interval is not None and self.iteration % spec.exit_interval == 0
        if want_signal:
            return "signal"
        if over_time:
            return "duration"
        if at_interval:
            return "interval"
        return None

    # -- save ----------------------------------------------------------------------------------
    def save(self) -> Path:
        """A torch_dist checkpoint of iteration `iteration` in `save`, as Megatron-LM writes it."""
        model_sd = self.layout.model_state(self.model, buffers=True)
        try:
            return self._save(model_sd)
        except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
            # a full or read-only disk surfaces from the writers as RuntimeError/CheckpointException
            problem = os_error_in(err) or storage_problem(self.spec.save)
            if problem is None:
                raise
            raise file_system_error(
                problem, f"saving iteration {self.iteration} to {self.spec.save}"
            ) from err

    def _save(self, model_sd: dict) -> Path:
        return save_checkpoint(
            self.spec.save,
            self.iteration,
            model=self.model,
            args=checkpoint_args(self.spec, self.iteration, self.consumed, self.bf16),
            sharded_extra={
                "optimizer": sharded_state_dict(self.optimizer, model_sd, self.model_params),
                "rng_state": rng_sharded_object(self.spec.seed),
            },
            common_extra={
                "opt_param_scheduler": self.scheduler.megatron_state(self.spec.global_batch_size),
                "num_floating_point_operations_so_far": 0,
            },
            content_metadata=optim.CONTENT_METADATA,
            model_state=model_sd,
        )


# -- what a checkpoint holds besides the model and optimizer ------------------------------------


def checkpoint_args(spec: TrainSpec, iteration: int, consumed: int, bf16: bool = False) -> argparse.Namespace:
    """The `args` Namespace Megatron-LM and `longctx ckpt inspect` read from a checkpoint."""
    a = spec.arch
    world = dist.get_world_size() if dist.is_initialized() else 1
    ns = argparse.Namespace(
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads,
        num_query_groups=a.query_groups,
        group_query_attention=a.query_groups != a.num_attention_heads,
        kv_channels=a.head_dim,
        normalization=a.normalization,
        norm_epsilon=a.norm_epsilon,
        swiglu=a.swiglu,
        qk_layernorm=a.qk_layernorm,
        untie_embeddings_and_output_weights=a.untie_embeddings_and_output_weights,
        add_bias_linear=a.add_bias_linear,
        add_qkv_bias=a.add_qkv_bias,
        init_method_std=a.init_method_std,
        position_embedding_type="rope",
        rotary_base=spec.rotary_base,
        rotary_percent=a.rotary_percent,
        rotary_interleaved=False,
        seq_length=spec.seq_length,
        max_position_embeddings=spec.max_position_embeddings,
        padded_vocab_size=spec.padded_vocab_size,
        make_vocab_size_divisible_by=spec.make_vocab_size_divisible_by,
        vocab_size=spec.tokenizer.vocab_size,
        tokenizer_type=spec.tokenizer.megatron_type,
        tokenizer_model=spec.tokenizer.path,
        tensor_model_parallel_size=spec.tensor_parallel,
        pipeline_model_parallel_size=1,
        context_parallel_size=spec.context_parallel,
        data_parallel_size=world // (spec.tensor_parallel * spec.context_parallel),
        world_size=world,
        micro_batch_size=spec.micro_batch_size,
        global_batch_size=spec.global_batch_size,
        train_iters=spec.train_iters,
        lr=spec.lr.lr,
        min_lr=spec.lr.min_lr,
        lr_decay_style=spec.lr.decay_style,
        lr_warmup_iters=spec.lr.warmup_iters,
        weight_decay=spec.lr.weight_decay,
        clip_grad=spec.lr.clip_grad,
        seed=spec.seed,
        bf16=bf16,
        fp16=False,
        ckpt_format="torch_dist",
        iteration=iteration,
        consumed_train_samples=consumed,
        skipped_train_samples=0,
        consumed_valid_samples=0,
        num_experts=a.num_experts,
        longctx_stage=spec.stage,
        longctx_tokenizer_md5=spec.tokenizer.md5,
        longctx_objective=spec.objective.kind,
    )
    return ns


def run(spec: TrainSpec) -> RunResult:
    return Trainer(spec).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longctx.train", description="longctx local trainer worker")
    p.add_argument("--spec", required=True, help="TrainSpec JSON written by `longctx stage run`")
    ns = p.parse_args(argv)
    # handlers first: a SIGTERM during start-up (or after the final save, while shutting down) must
    # not kill the worker with 143 — during start-up it makes the first step save and exit
    signals.install()
    spec = TrainSpec.read(ns.spec)
    try:
        result = run(spec)
    except LongctxError as err:  # a refusal (no GPU for this rank, a full disk, …): its message, no traceback
        print(f"[longctx] error: {err}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    _log(
        f"[longctx] {spec.stage}: iterations {result.start_iteration} → {result.end_iteration} ({result.reason})"
    )
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
