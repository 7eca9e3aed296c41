"""What `stage run` and `rope sweep` share: the launcher a name stands for, the target cluster's device facts,
and the progress lines each step prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.cli._common import console, err_console
from longctx.errors import StageError
from longctx.util.printable import printable

if TYPE_CHECKING:
    from longctx.launch.local import Launcher
    from longctx.plan.derive import ResolvedPlan
    from longctx.plan.rope_sweep import SweepChoice
    from longctx.stage.preflight import DeviceFacts, PreflightReport
    from longctx.stage.run import LaunchOutcome, LaunchPlan
    from longctx.stage.state import NextStep

# The library is imported inside the functions: `longctx --help` need not load the launch machinery.


def launcher_named(name: str) -> Launcher:
    """The launcher `--launcher NAME` names: `local` (torchrun here) or `srun` (inside a Slurm allocation)."""
    if name == "local":
        from longctx.launch.local import LocalLauncher

        return LocalLauncher()
    if name == "srun":
        from longctx.launch.srun import SrunLauncher

        return SrunLauncher.from_environment()
    raise StageError(f"unknown launcher {name!r}", fix="use --launcher local or --launcher srun")


def device_facts(rp: ResolvedPlan, profile: str | None) -> DeviceFacts:
    """The device facts of the target cluster: the named profile, else the plan's cluster.profile."""
    from longctx.slurm.commands import preflight_facts
    from longctx.slurm.profiles import load_profile

    profile_name = profile or rp.cluster.profile
    return preflight_facts(load_profile(profile_name), gpu_memory_gib=rp.cluster.gpu_memory_gib)


def repair_text(step: NextStep, before: str, after: str) -> str:
    """The tracker fixes a launch applies first, for a progress line ('' when none)."""
    parts = [f"repair: {step.repair.reason}"] if step.repair else []
    if step.load_repair:
        parts.append(f"repair of the loaded stage's tracker: {step.load_repair.reason}")
    return f"{before}{'; '.join(parts)}{after}" if parts else ""


def _err(line: str) -> None:
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


class RunPrinter:
    """`stage run`'s progress lines: what each step launches and how it ended."""

    def launching(self, lp: LaunchPlan) -> None:
        console.print(
            f"[bold]{lp.step.action}[/] {lp.stage.name}: {lp.step.reason}{repair_text(lp.step, ' — ', '')}"
        )
        if lp.schedule_override:
            changed = "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in lp.schedule_override.items())
            _err(
                f"warning: --force: {lp.stage.name} resumes with another LR schedule ({changed}): "
                "--override-opt_param-scheduler"
            )

    def planned(self, lp: LaunchPlan) -> None:
        console.print(f"{lp.nproc} × {lp.shell()}", soft_wrap=True, highlight=False)

    def preflight_passed(self, lp: LaunchPlan, report: PreflightReport) -> None:
        console.print(f"preflight: Megatron-LM accepts {lp.stage.name} ({report.seconds:.0f} s)")

    def finished(self, outcome: LaunchOutcome) -> None:
        console.print(
            f"{outcome.stage}: exit {outcome.exit_code}, iteration {outcome.start_iteration} → "
            f"{outcome.end_iteration} ({outcome.status}), {outcome.seconds:.0f} s"
        )
        if outcome.no_progress:
            _err(f"{'error' if outcome.verdict == 'failed' else 'warning'}: {printable(outcome.no_progress)}")
        if outcome.storage:
            _err(f"error: {outcome.storage}")
        for d in outcome.discarded:
            _err(f"removed the unfinished save {d}")

    def warning(self, text: str) -> None:
        _err(text)

    def sweep_starts(self, lines: list[str]) -> None:
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    def chose(self, stage: str, choice: SweepChoice | None) -> None:
        if choice is None:
            console.print(
                f"[bold]choose[/] {stage}: would evaluate the sweep's branches and choose the RoPE base"
            )
            return
        console.print(f"[bold]chose[/] {stage}: RoPE {choice.reason}", highlight=False, soft_wrap=True)
