"""The training objective a plan continues its base with, shared by the plan, the checkpoint tools and
the local trainer.

* `ar`: next-token cross-entropy under causal attention (GPT).
* `mdm`: masked diffusion. Each sequence draws a time t; each token is replaced by the [MASK] id with
  probability 1 − α_t; the loss is the per-token ELBO  Σ_masked CE · (−α'_t / (1 − α_t)) / L over all
  L tokens (1/t for the linear schedule α_t = 1 − t). Bidirectional attention.
* `udm`: uniform-state diffusion. Each token is replaced with probability 1 − α_t by a token drawn
  uniformly from the vocabulary (possibly itself); the loss is a continuous-time bound at every
  position. `bound = "udlm"`: the UDLM / Duo bound, which needs Σ over the vocabulary of
  log(N·α_t·p_θ + 1 − α_t) at each position. `bound = "gidd"`: GIDD's KL + importance-sampling form of
  the same bound (equal at every position for uniform noise without time conditioning), trained with
  GIDD's weighting (the bound times the density of the log-SNR, w·(KL + IS)); evaluation reports the
  bound either way. Bidirectional attention.

The noise level t is drawn per sequence, stratified over the global batch (antithetic: one uniform
offset per batch, the sequences spread evenly over [t_min, 1]), so a batch sees the whole range.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ObjectiveKind = Literal["ar", "mdm", "udm"]
Schedule = Literal["linear", "log-linear"]
UdmBound = Literal["udlm", "gidd"]

# the lower end of t by objective: masked diffusion's weight 1/t is bounded by it; the uniform bound's
# log(1 − α_t) terms diverge at t = 0
DEFAULT_T_MIN = {"mdm": 1e-6, "udm": 1e-3}
DEFAULT_SCHEDULE: dict[str, Schedule] = {"mdm": "linear", "udm": "log-linear"}


class Objective(BaseModel):
    """A plan's `[objective]` table (and the trainer's copy of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ObjectiveKind = "ar"
    # α_t: "linear" 1 − t; "log-linear" 1 − (1 − eps)·t (α_1 = eps > 0 keeps the uniform bound finite)
    schedule: Schedule | None = None  # None: linear for mdm, log-linear for udm
    eps: float = Field(default=1e-3, ge=0, lt=1)
    t_min: float | None = Field(default=None, ge=0, lt=1)  # None: 1e-6 (mdm), 1e-3 (udm)
    antithetic: bool = True
    # mdm: the [MASK] id; None = the tokenizer's vocabulary size (the first id past it, the row the
    # checkpoint adds to its input embedding), checked against the checkpoint before the first launch
    mask_id: int | None = Field(default=None, ge=0)
    bound: UdmBound = "udlm"
    # embedding / output-layer rows when they are not the plan's padded vocabulary (diffusion models
    # are built unpadded: input = vocabulary + the [MASK] row, output = vocabulary); None = derived
    input_rows: int | None = Field(default=None, gt=0)
    output_rows: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.kind == "ar" and (self.schedule or self.t_min is not None or self.mask_id is not None):
            raise ValueError(
                "schedule, t_min and mask_id belong to a diffusion objective (kind = 'mdm' or 'udm')"
            )
        if self.kind != "udm" and self.bound != "udlm":
            raise ValueError(f"bound = {self.bound!r} is a uniform-state bound (kind = 'udm')")
        if self.kind != "mdm" and self.mask_id is not None:
            raise ValueError(f"mask_id is for kind = 'mdm' (a {self.kind} model has no [MASK] token)")
        if self.kind == "udm" and self.resolved_schedule == "linear" and self.resolved_t_min == 0:
            raise ValueError("the uniform bound diverges at t = 0 with the linear schedule: set t_min > 0")
        return self

    @property
    def causal(self) -> bool:
        return self.kind == "ar"

    @property
    def resolved_schedule(self) -> Schedule:
        return self.schedule or DEFAULT_SCHEDULE.get(self.kind, "linear")

    @property
    def resolved_t_min(self) -> float:
        return DEFAULT_T_MIN.get(self.kind, 0.0) if self.t_min is None else self.t_min

    def describe(self) -> str:
        if self.kind == "ar":
            return "autoregressive (next-token CE, causal)"
        s = f"{self.kind} ({self.resolved_schedule} schedule, t in [{self.resolved_t_min:g}, 1]"
        if self.resolved_schedule == "log-linear":
            s += f", eps {self.eps:g}"
        if self.kind == "mdm":
            s += f", mask id {self.mask_id if self.mask_id is not None else 'vocab size'}"
        else:
            s += ", UDLM bound" if self.bound == "udlm" else ", GIDD's KL + IS loss weighting"
        return s + ", bidirectional)"


__all__ = ["DEFAULT_T_MIN", "Objective", "ObjectiveKind", "Schedule", "UdmBound"]
