"""What the preflight parent (`longctx.stage.preflight`) and its child (`longctx.stage.preflight_worker`) say
to each other, one definition for both sides: the request file the parent writes, the reply file the child
writes (whatever happens to it).

Only pydantic and the standard library are imported here: the child loads this before the entry script
runs, and nothing of longctx may put Megatron-LM modules in place before the checkout's own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Message(BaseModel):
    # both sides are the same longctx: a key one side does not know is a bug, not a newer version
    model_config = ConfigDict(extra="forbid")


class TargetFacts(_Message):
    """The target's devices, stood in for the hardware the child's host lacks (`preflight.DeviceFacts`)."""

    source: str
    gpu_arch: tuple[int, int] | None = None  # compute capability; None: no GPU
    gpu_name: str | None = None
    gpu_memory_gib: float | None = None
    multi_processor_count: int | None = None  # None: an A100's
    transformer_engine: str | None = None  # TE's version; None: absent


class StageRequest(_Message):
    """One stage's argv to check (without the script word), and what its model must apply."""

    stage: str
    argv: list[str]
    world_size: int
    gpus_per_node: int
    cuda_device_max_connections: str | None = None  # the launch environment's
    rotary: bool = True  # build the model and check its RoPE
    rotary_base: float | None = None  # expected; None: whatever --rotary-base says
    seq_length: int | None = None  # expected; None: whatever --seq-length says


class PreflightRequest(_Message):
    script: str  # the entry script (pretrain_gpt.py of a checkout, or a fork's)
    result: str  # where the child writes its PreflightReply
    sys_path: list[str] = Field(default_factory=list)  # $PYTHONPATH of the launch environment
    facts: TargetFacts
    stages: list[StageRequest]


class Check(_Message):
    """One check of a stage and its outcome."""

    name: str
    ok: bool
    detail: str = ""
    message: str | None = None  # Megatron's own (or the fork's) message on failure
    where: str | None = None


class StageResult(_Message):
    """One stage's checks as the child ran them (in order; the first failure ends the stage)."""

    stage: str
    checks: list[Check] = Field(default_factory=list)
    device_calls: dict[str, int] = Field(default_factory=dict)  # torch.cuda queries answered from the facts
    seconds: float = 0.0
    rotary: dict[str, Any] | None = None  # what the rotary check found (model class, applied base, …)
    model_provider: str | None = None
    traceback: str | None = None


class PreflightReply(_Message):
    stages: list[StageResult] = Field(default_factory=list)
    stood_in: list[str] = Field(default_factory=list)  # what the child replaced besides the device facts
    error: str | None = None  # the child itself failed (not a stage's check)
    traceback: str | None = None


__all__ = ["Check", "PreflightReply", "PreflightRequest", "StageRequest", "StageResult", "TargetFacts"]
