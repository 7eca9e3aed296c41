"""What one run of the local trainer does — a typed, JSON-serialisable spec.

The stage launcher builds it from a resolved plan; the trainer never reads TOML. It is written to the
stage directory and passed to every torchrun worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from longctx.arch import ModelArch
from longctx.objective import Objective
from longctx.util.fs import atomic_write_text
from longctx.util.wandb_settings import WandbSettings


class LRSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float
    min_lr: float
    warmup_iters: int = 0
    decay_iters: int
    decay_style: Literal["cosine", "WSD", "linear", "constant"] = "cosine"
    wsd_decay_iters: int | None = None
    wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = "linear"
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0


class TokenizerInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    md5: str
    vocab_size: int
    eod_id: int
    pad_id: int | None = None
    megatron_type: str = "HuggingFaceTokenizer"


class TrainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    arch: ModelArch
    seq_length: int
    max_position_embeddings: int
    rotary_base: int
    padded_vocab_size: int  # input-embedding rows
    output_vocab_size: int | None = None  # output-layer rows when not padded_vocab_size (untied only)
    make_vocab_size_divisible_by: int = 128
    objective: Objective = Field(default_factory=Objective)
    tokenizer: TokenizerInfo
    # data: [(weight, prefix)]; weights None → size-weighted
    data: list[tuple[float | None, str]]
    split: str = "99,1,0"
    data_cache_path: str
    # "documents": attention within the documents of each sample (boundaries after EOD tokens)
    packing: Literal["concat", "documents"] = "concat"
    reset_position_ids: bool = False  # position ids restart at each document
    # the CP split of packed samples: "auto" takes the one `attention.split_cost` models faster per batch
    cp_split: Literal["auto", "zigzag", "balanced"] = "auto"
    seed: int = 1234
    micro_batch_size: int = 1
    global_batch_size: int
    train_iters: int
    lr: LRSchedule
    tensor_parallel: int = 1
    context_parallel: int = 1
    attention: Literal["longctx", "te", "megatron-local"] = "longctx"
    cp_comm: Literal["ring", "allgather"] = "ring"
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_method: Literal["uniform", "block"] = "uniform"  # full recompute only
    recompute_num_layers: int = Field(default=1, ge=1)  # full recompute only
    bf16: bool | None = None  # None: bf16 on GPU, fp32 on CPU
    # checkpoints: save == load (resume); pretrained = previous stage (weights only, finetune semantics);
    # neither → random initialisation (pretraining a base model)
    save: str
    pretrained: str | None = None
    # every layer's attention logits × this when the stage starts from `pretrained` (longctx.mcore.attention_scale)
    attention_scale: float = Field(default=1.0, gt=0)
    save_interval: int
    exit_duration_in_mins: float | None = None
    exit_interval: int | None = None
    log_interval: int = 1
    threads_per_process: int | None = None
    metrics_file: str | None = None
    tensorboard_dir: str | None = None  # Megatron-LM's tags, one event file per launch (longctx.train.events)
    wandb: WandbSettings | None = (
        None  # the stage's run (plan.values.stage_wandb); logged when `wandb` is installed
    )
    extra_args: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _packing(self) -> TrainSpec:
        if self.packing == "documents" and self.attention != "longctx":
            raise ValueError(
                f"packing = 'documents' needs attention = 'longctx' (got {self.attention!r}): only longctx's "
                "attention takes document boundaries on the local backend"
            )
        if self.objective.kind == "mdm" and self.objective.mask_id is None:
            raise ValueError("objective.mask_id must be resolved for the masked-diffusion objective")
        if self.objective.kind == "mdm" and self.objective.mask_id >= self.padded_vocab_size:  # type: ignore[operator]
            raise ValueError(
                f"mask id {self.objective.mask_id} has no input-embedding row ({self.padded_vocab_size} rows)"
            )
        return self

    def dump(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> TrainSpec:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
