"""Batch scripts of a plan: one chain job (every job of the chain runs it) and, for the megatron-lm
backend (or when asked), one eval job per stage.

`render(rp, profile=, overrides=, out_dir=, longctx_command=, eval_jobs=)` → `Rendered` (texts, not yet written);
`Rendered.write()` writes them atomically. Output is a pure function of the plan, the profile and the
options: no time stamps, sorted environment, every value quoted (`quote.py`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from longctx.checkpoint.save_layout import iter_dir_name
from longctx.errors import SlurmError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.eval_memory import BATCHES, eval_cp
from longctx.plan.memory import GiB
from longctx.slurm.profiles import Profile
from longctx.slurm.quote import env_name, fill, sbatch_word, sh, sh_words, slurm_filename
from longctx.slurm.settings import JobSettings, job_settings
from longctx.util.confine import check_output_dir, refuse_write_into
from longctx.util.fs import atomic_write_text

CHAIN_SCRIPT = "chain.sbatch"
SRUN_CONFIG_ENV = "LONGCTX_SRUN_CONFIG"
RUN_DIR_ENV = "LONGCTX_RUN_DIR"
MEGATRON_ENV = "LONGCTX_MEGATRON_LM"


def eval_script_name(stage: str) -> str:
    return f"eval-{stage}.sbatch"


def sweep_script_name(stage: str, role: Literal["branches", "choose"]) -> str:
    """A RoPE sweep's scripts: the job array of its branches, and the job that chooses."""
    return f"sweep-{stage}.sbatch" if role == "branches" else f"choose-{stage}.sbatch"


def default_out_dir(run_dir: Path) -> Path:
    return run_dir / "slurm"


def log_dir(run_dir: Path) -> Path:
    return run_dir / "logs"


@dataclasses.dataclass(frozen=True)
class Script:
    name: str
    kind: Literal["chain", "eval", "sweep"]
    text: str
    stage: str | None = None


@dataclasses.dataclass
class Rendered:
    settings: JobSettings
    out_dir: Path
    scripts: list[Script]
    inputs: list[Path] = dataclasses.field(default_factory=list)  # what the scripts must not land in
    notes: list[str] = dataclasses.field(
        default_factory=list
    )  # what rendering decided that the user should know

    @property
    def warnings(self) -> tuple[str, ...]:
        return (*self.settings.warnings, *self.notes)

    def path(self, script: Script) -> Path:
        return self.out_dir / script.name

    @property
    def chain(self) -> Script:
        return next(s for s in self.scripts if s.kind == "chain")

    def eval_script(self, stage: str) -> Script | None:
        return next((s for s in self.scripts if s.kind == "eval" and s.stage == stage), None)

    def write(self) -> list[Path]:
        """Write the scripts into `out_dir`; refused inside any of `inputs` (the plan's tokenizer, base
        checkpoint, plan file), or where a directory cannot be made. A failure leaves no script behind."""
        check_output_dir(self.out_dir, option="--out", what="the Slurm scripts")
        for source in self.inputs:
            refuse_write_into(self.out_dir, source, "--out")
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise SlurmError(
                f"{self.out_dir} is a file, not a directory for the scripts",
                where=str(self.out_dir),
                fix="pass --out DIR naming a directory (new or existing)",
            )
        out: list[Path] = []
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            log_dir(self.settings.run_dir).mkdir(parents=True, exist_ok=True)  # sbatch needs the --output dir
            for s in self.scripts:
                p = self.path(s)
                atomic_write_text(p, s.text)
                p.chmod(0o755)
                out.append(p)
        except OSError as err:
            for p in out:
                p.unlink(missing_ok=True)
            raise SlurmError(
                f"cannot write the Slurm scripts: {err.strerror}",
                where=str(err.filename or self.out_dir),
                fix="choose a writable --out directory on a filesystem with free space",
            ) from None
        return out


def template(name: str) -> str:
    path = resources.files("longctx") / "resources" / "slurm" / "templates" / f"{name}.sbatch.tmpl"
    return path.read_text(encoding="utf-8")


def default_longctx_command() -> list[str]:
    return [sys.executable, "-m", "longctx"]


def render(
    rp: ResolvedPlan,
    *,
    profile: str | Profile | None = None,
    overrides: dict[str, Any] | None = None,
    out_dir: Path | None = None,
    longctx_command: list[str] | None = None,
    eval_jobs: bool | None = None,
) -> Rendered:
    """The plan's scripts. `eval_jobs`: render a stage's eval job (`slurm job-end` submits it when the stage
    finishes); None: the backend's choice, megatron-lm only (the local backend's `stage run` evaluates a
    finished stage itself, per [local] eval_after_stage)."""
    settings = job_settings(rp, profile, overrides)
    eff = settings.profile
    out = Path(out_dir).resolve() if out_dir is not None else default_out_dir(settings.run_dir)
    command = longctx_command or eff.longctx_command or default_longctx_command()
    env = _environment(settings, str(settings.plan_path))
    scripts = [_chain_script(rp, settings, env, command, out)]
    scripts += _sweep_scripts(rp, settings, env, command)
    notes: list[str] = []
    if eval_jobs or (eval_jobs is None and settings.backend == "megatron-lm"):
        scripts += [_eval_script(rp, st, settings, env, command, notes) for st in rp.stages]
    return Rendered(settings, out, scripts, inputs=plan_inputs(rp), notes=notes)


def _chain_script(rp: ResolvedPlan, settings: JobSettings, env: str, command: list[str], out: Path) -> Script:
    """The chain job's script: every job of the chain runs it (`stage run`, then `slurm job-end`)."""
    eff = settings.profile
    chain_directives = _directives(
        settings, nodes=settings.nodes, time=eff.time.strip(), name=settings.job_name, signal=True
    )
    return Script(
        CHAIN_SCRIPT,
        "chain",
        fill(
            template("chain"),
            {
                "title": _comment(
                    f"longctx chain job: plan {settings.plan_name}, profile {eff.name}, "
                    f"backend {settings.backend}"
                ),
                "directives": chain_directives,
                "environment": env,
                "longctx": sh_words(command, "longctx command"),
                "plan": sh(settings.plan_path, "plan path"),
                "backend": sh(settings.backend),
                "launcher": sh(settings.launcher),
                "stage_options": _stage_options(settings)
                + (" --sweep-branches array" if any(st.sweep for st in rp.stages) else ""),
                "scripts_dir": sh(out, "scripts directory"),
            },
            where=f"template {CHAIN_SCRIPT}",
        ),
    )


def _eval_script(
    rp: ResolvedPlan, st: ResolvedStage, settings: JobSettings, env: str, command: list[str], notes: list[str]
) -> Script:
    """A stage's eval job (megatron-lm backend), sized by the evaluation's memory model; a note on how it
    launches is added to `notes` once."""
    eff, where = settings.profile, str(settings.plan_path)
    directives = _directives(
        settings,
        nodes=eff.eval_nodes,
        time=eff.eval_time.strip(),
        name=f"{settings.job_name}-eval-{st.name}",
        signal=False,
    )
    final = st.save_dir / iter_dir_name(st.train_iters)
    est, batch = eval_cp(
        rp.arch,
        st.padded_vocab_size,
        st.seq_length,
        max_cp=settings.gpus_per_node,
        gpu_memory_gib=rp.cluster.gpu_memory_gib,
        margin=rp.cluster.memory_margin,
        where=f"{where}: stage {st.name}",
    )
    launch, note = eval_launch(command, est.cp)
    if note and note not in notes:
        notes.append(note)
    return Script(
        eval_script_name(st.name),
        "eval",
        fill(
            template("eval"),
            {
                "title": _comment(
                    f"longctx eval job: plan {settings.plan_name}, stage {st.name}, profile {eff.name}"
                ),
                "directives": directives,
                "environment": env,
                "longctx": sh_words(launch, "longctx command"),
                "checkpoint": sh(final, "checkpoint path"),
                "plan": sh(settings.plan_path, "plan path"),
                "stage": sh(st.name, "stage name"),
                "eval_options": ""
                if est.cp == 1 and batch == BATCHES[0]
                else f" --cp {est.cp} --batch-size {batch}",
                "memory": _comment(
                    f"memory per GPU (longctx.plan.eval_memory): {est.total / GiB:.1f} of "
                    f"{est.budget / GiB:.1f} GiB at CP {est.cp}, {batch} per forward"
                ),
            },
            where=f"template {eval_script_name(st.name)}",
        ),
        stage=st.name,
    )


_SWEEP_ROLES = {
    "branches": "One task of the job array that trains a RoPE sweep's branches: task N trains branch N until "
    "it is done (resumable: a task that dies keeps its saves, and the choose job resumes any unfinished "
    "branch before it evaluates them).",
    "choose": "After the job array: finish any branch a task left unfinished, evaluate every branch at the "
    "stage's length and record the chosen RoPE base; the chain's next job waits for this one.",
}


def _sweep_scripts(rp: ResolvedPlan, settings: JobSettings, env: str, command: list[str]) -> list[Script]:
    """For each stage with a RoPE sweep, its job array of branches and its choose job (`slurm job-end`
    submits both when the chain reaches the sweep)."""
    out = []
    eff = settings.profile
    for st in rp.stages:
        if st.sweep is None:
            continue
        for role in ("branches", "choose"):
            name = sweep_script_name(st.name, role)  # type: ignore[arg-type]
            directives = _directives(
                settings,
                nodes=st.nodes,
                time=eff.time.strip(),
                name=f"{settings.job_name}-{role}-{st.name}",
                signal=True,
            )
            extra = ' --branch-index "$SLURM_ARRAY_TASK_ID"' if role == "branches" else ""
            out.append(
                Script(
                    name,
                    "sweep",
                    fill(
                        template("sweep"),
                        {
                            "title": _comment(
                                f"longctx RoPE sweep ({role}): plan {settings.plan_name}, stage {st.name}, "
                                f"profile {eff.name}"
                            ),
                            "directives": directives,
                            "role": _comment(_SWEEP_ROLES[role]),
                            "environment": env,
                            "longctx": sh_words(command, "longctx command"),
                            "plan": sh(settings.plan_path, "plan path"),
                            "stage": sh(st.name, "stage name"),
                            "backend": sh(settings.backend),
                            "launcher": sh(settings.launcher),
                            "sweep_options": _stage_options(settings) + extra,
                        },
                        where=f"template {name}",
                    ),
                    stage=st.name,
                )
            )
    return out


def eval_launch(command: list[str], cp: int) -> tuple[list[str], str | None]:
    """The eval job's command (eval run --cp N needs exactly N processes) and a note for the user: longctx
    itself at CP 1; `PYTHON -m longctx` becomes the same python's torch.distributed.run of `-m longctx`;
    another command (a wrapper script) is run by `torchrun --no-python` from the job's PATH."""
    if cp == 1:
        return command, None
    if len(command) >= 3 and command[1:3] == ["-m", "longctx"]:
        return [
            command[0],
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={cp}",
            "-m",
            "longctx",
            *command[3:],
        ], None
    note = (
        f"the eval jobs run {cp} processes (context parallelism) through `torchrun --no-python` from the "
        f"job's PATH, since the longctx command {' '.join(command)!r} is not `PYTHON -m longctx`"
    )
    return ["torchrun", "--standalone", f"--nproc-per-node={cp}", "--no-python", *command], note


def plan_inputs(rp: ResolvedPlan) -> list[Path]:
    """The plan file, its tokenizer and its base checkpoint: inputs no output may land in."""
    found = [rp.tokenizer.path]
    if rp.base.path is not None:
        found.append(rp.base.path)
    if rp.source is not None:
        found.append(Path(rp.source))
    return found


def _stage_options(s: JobSettings) -> str:
    """`stage run` options after --launcher (each with its leading space): none by default."""
    if s.backend == "megatron-lm" and not s.job_preflight:
        return " --no-preflight"
    return ""


def _comment(text: str) -> str:
    return " ".join(text.split())  # one line: a comment must not spill into the script


def _directives(s: JobSettings, *, nodes: int, time: str, name: str, signal: bool) -> str:
    eff = s.profile
    d: list[tuple[str, str | int | None]] = [("job-name", name)]
    for key in ("account", "partition", "qos", "reservation"):
        if getattr(eff, key):
            d.append((key, getattr(eff, key)))
    d += [("nodes", nodes), ("ntasks-per-node", 1)]
    if eff.cpus_per_task:
        d.append(("cpus-per-task", eff.cpus_per_task))
    if s.gpus_per_node and eff.gpus_per_node:
        if eff.gpu_directives in ("gres", "both"):
            d.append(("gres", f"gpu:{s.gpus_per_node}"))
        if eff.gpu_directives in ("gpus-per-node", "both"):
            d.append(("gpus-per-node", s.gpus_per_node))
    if eff.exclusive:
        d.append(("exclusive", None))
    if eff.constraint:
        d.append(("constraint", eff.constraint))
    if eff.exclude:
        d.append(("exclude", eff.exclude))
    d.append(("time", time))  # as written (validated): "24:00:00" stays recognisable
    if signal:
        d.append(("signal", s.signal.directive()))
    d.append(("output", slurm_filename(str(log_dir(s.run_dir))) + "/slurm-%j.log"))
    lines = [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={sbatch_word(v, f'--{k}')}" for k, v in d]
    for extra in eff.extra_sbatch:
        if not extra.startswith("--"):
            raise SlurmError(
                f"extra_sbatch entry {extra!r} is not a long option",
                where=str(s.plan_path),
                fix='write each entry as "--option=value"',
            )
        lines.append(f"#SBATCH {sbatch_word(extra, 'extra_sbatch')}")
    return "\n".join(lines)


def srun_config(s: JobSettings) -> dict[str, Any]:
    """What `SrunLauncher.from_environment()` reads from $LONGCTX_SRUN_CONFIG inside the job."""
    eff = s.profile
    c = eff.container
    return {
        "container": None if c is None or not c.image else c.model_dump(),
        "cpus_per_task": eff.cpus_per_task,
        "master_addr": eff.master_addr,
        "master_port": eff.master_port,
        "srun_args": list(eff.srun_args),
        "torchrun": eff.torchrun,
    }


def _environment(s: JobSettings, where: str) -> str:
    eff = s.profile
    env: dict[str, str] = {k: str(v) for k, v in eff.env.items()}
    reserved = {RUN_DIR_ENV, SRUN_CONFIG_ENV, MEGATRON_ENV}
    clash = sorted(reserved & set(env))
    if clash:
        raise SlurmError(
            f"env sets {', '.join(clash)}, which the renderer owns",
            where=where,
            fix="remove them from the plan's slurm.env and the profile's env table",
        )
    lines = [f"export {env_name(k, where)}={sh(v, f'env {k}')}" for k, v in sorted(env.items())]
    lines.append(f"export {RUN_DIR_ENV}={sh(s.run_dir, 'run_dir')}")
    if s.megatron_lm:
        lines.append(f"export {MEGATRON_ENV}={sh(s.megatron_lm, 'megatron_lm')}")
    if s.launcher == "srun":
        lines.append(
            f"export {SRUN_CONFIG_ENV}={sh(json.dumps(srun_config(s), sort_keys=True), SRUN_CONFIG_ENV)}"
        )
    return "\n".join(lines)
