"""W&B settings, the one type from the plan's [wandb] table to both backends' runs: the plan's table as
written, the table with its directory resolved (`longctx.plan.values.resolve_wandb`), each stage's run
(`longctx.plan.values.stage_wandb`) and the local trainer's spec (`longctx.train.spec.TrainSpec.wandb`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WandbSettings(BaseModel):
    """W&B logging of both backends: Megatron-LM's --wandb-project / --wandb-exp-name / --wandb-save-dir,
    and the local trainer's own log (when `wandb` is installed). Each stage is its own W&B run, named
    `<exp_name>-<stage>`; save_dir defaults to the stage's directory (Megatron-LM's default is inside the
    checkpoint directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    project: str = Field(min_length=1)
    """The W&B project."""

    exp_name: str = Field(min_length=1)
    """The experiment's name; each stage's run is `<exp_name>-<stage>`."""

    save_dir: str | None = None
    """Where W&B writes its files, a `<stage>` subdirectory each (a path like the plan's others, e.g.
    `${RUN_DIR}/wandb`); default: `<stage dir>/wandb`."""
