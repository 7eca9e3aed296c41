"""The ledger's records: one pydantic model per event kind, told apart by the `event` field.

Writers build one of these and hand it to `ledger.append`; `ledger.read` validates every line into one.
Every field may be absent or null (a record written by an older longctx, or by hand, lacks some); a field
that is present must have its type (strictly: `true` is no integer, `"3"` no iteration). Fields a newer
longctx adds are ignored by an older one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

SlurmId = str | int  # Slurm's job ids: text as sbatch prints them, a number when written by hand


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)


class RecordedBinding(_Record):
    """What a launch bound its stage to (`ledger.Binding.to_json`); which keys a record holds matters:
    a record written before a field was bound is not compared on it (`model_fields_set`)."""

    tokenizer_md5: str | None = None
    data_digest: str | None = None
    base_identity: str | None = None
    rotary_base: int | float | None = None
    seq_length: int | None = None
    schedule: dict[str, Any] | None = None  # ledger.SCHEDULE_FIELDS → value
    rope_scaling: dict[str, Any] | None = None
    attention_scale: float | None = None
    identity: str | None = None  # ledger.CONTENT_IDENTITY: hashed by content, not by path


class _Event(_Record):
    """What `ledger.append` stamps on every record: when, where, which process and Slurm job."""

    time: str | None = None
    host: str | None = None
    pid: int | None = None
    job_id: SlurmId | None = None


class Launch(_Event):
    """A stage's process is about to start."""

    event: Literal["launch"] = "launch"
    stage: str | None = None
    action: str | None = None  # first-launch, resume, …
    backend: str | None = None
    start_iteration: int | None = None
    target_iterations: int | None = None
    argv_digest: str | None = None
    argv: list[str] | None = None
    cpu: dict[str, Any] | None = None  # Megatron-LM through the CPU runner: the runner and its flags
    binding: RecordedBinding | None = None
    log: str | None = None
    repair: dict[str, Any] | None = None  # a tracker fix applied before the launch
    load_repair: dict[str, Any] | None = None
    forced: dict[str, list[Any]] | None = None  # binding field → [ledger's, now] launched with --force
    schedule_override: dict[str, list[Any]] | None = None  # schedule field → [old, new]
    stale_lock: dict[str, Any] | None = None  # the lock of a gone launcher this launch replaced


class End(_Event):
    """A stage's process exited."""

    event: Literal["end"] = "end"
    stage: str | None = None
    exit_code: int | None = None
    start_iteration: int | None = None
    end_iteration: int | None = None
    status: str | None = None
    seconds: float | None = None
    new_saves: list[int] | None = None
    outcome: str | None = None  # ok, failed, interrupted
    no_progress: str | None = None
    log_lines: list[str] | None = None
    discarded: list[str] | None = None
    storage: str | None = None

    @property
    def progressed(self) -> bool:
        """The launch trained (its iteration advanced) or saved."""
        return (self.end_iteration or 0) > (self.start_iteration or 0) or bool(self.new_saves)

    @property
    def gained(self) -> int:
        """Iterations the launch trained (negative for a damaged record)."""
        return (self.end_iteration or 0) - (self.start_iteration or 0)


class Submit(_Event):
    """A Slurm job this plan queued: a chain job, an evaluation, a sweep's job array or choose job."""

    event: Literal["submit"] = "submit"
    kind: str | None = None
    slurm_job_id: SlurmId | None = None
    stage: str | None = None
    chain_id: str | None = None
    position: int | None = None
    chain_length: int | None = None
    dependency: SlurmId | None = None
    script: str | None = None
    profile: str | None = None
    backend: str | None = None
    tasks: list[int] | None = None
    branches: list[str] | None = None


class SubmitFailed(_Event):
    event: Literal["submit-failed"] = "submit-failed"
    kind: str | None = None
    stage: str | None = None
    error: str | None = None


class JobEnd(_Event):
    """A chain job's end: what it trained and what the plan does next."""

    event: Literal["job-end"] = "job-end"
    exit_code: int | None = None
    progress: int | None = None
    next_action: str | None = Field(None, alias="next")
    next_stage: str | None = None
    reason: str | None = None
    finished_stages: list[str] | None = None


class ChainCancel(_Event):
    """A chain job cancelled the chain's jobs queued behind it."""

    event: Literal["chain-cancel"] = "chain-cancel"
    slurm_job_ids: list[SlurmId] | None = None
    reason: str | None = None


class Cancel(_Event):
    """`slurm cancel` cancelled the plan's jobs."""

    event: Literal["cancel"] = "cancel"
    slurm_job_ids: list[SlurmId] | None = None
    reason: str | None = None


class ChainWait(_Event):
    """The chain's next job was made to wait for a sweep's choose job."""

    event: Literal["chain-wait"] = "chain-wait"
    slurm_job_id: SlurmId | None = None
    waits_for: SlurmId | None = None
    stage: str | None = None


class RopeSweep(_Event):
    """A RoPE sweep's choice (as `choice.json` holds it)."""

    event: Literal["rope-sweep"] = "rope-sweep"
    stage: str | None = None
    base: int | None = None
    rule: str | None = None
    reason: str | None = None
    candidates: list[int] | None = None
    branch_tokens: int | None = None
    evidence: list[dict[str, Any]] | None = None


LedgerEvent = Launch | End | Submit | SubmitFailed | JobEnd | ChainCancel | Cancel | ChainWait | RopeSweep
EVENT_TYPES: tuple[type[_Event], ...] = (
    Launch,
    End,
    Submit,
    SubmitFailed,
    JobEnd,
    ChainCancel,
    Cancel,
    ChainWait,
    RopeSweep,
)
EVENTS = tuple(t.model_fields["event"].default for t in EVENT_TYPES)
RECORD: TypeAdapter[LedgerEvent] = TypeAdapter(Annotated[LedgerEvent, Field(discriminator="event")])

__all__ = [
    "EVENTS",
    "EVENT_TYPES",
    "RECORD",
    "Cancel",
    "ChainCancel",
    "ChainWait",
    "End",
    "JobEnd",
    "Launch",
    "LedgerEvent",
    "RecordedBinding",
    "RopeSweep",
    "Submit",
    "SubmitFailed",
]
