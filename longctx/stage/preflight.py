"""Preflight: a stage's exact argv through Megatron-LM's own parser, validator and model, before a launch.

    facts = DeviceFacts(source="profile leonardo", gpu_arch=(8, 0), transformer_engine="2.8.0",
                        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    report = preflight_plan(rp, facts)            # every stage, one child process
    report.ok, report.stages[0].checks            # typed: which checks passed, Megatron's message if not
    require_passed(report)                        # PreflightError (a StageError) quoting Megatron

The checkout's `pretrain_gpt.py` (or a fork's entry script) runs in a child process
(`longctx.stage.preflight_worker`): importing `megatron.training` changes global state, so it never happens
in this one. There the argv goes through `megatron.training.arguments.parse_args(ignore_unknown_args=False)`,
`validate_args` and `core_transformer_config_from_args`, and the model the entry script's own model provider
builds (tiny widths, CPU) has its rotary `inv_freq` compared with 1/base^(2i/d) of the stage's base. A login
node has no GPU, so the target's device facts stand in: the GPU's compute capability for torch.cuda's device
queries, TransformerEngine present or absent for TransformerConfig's fusion checks, the world size of the stage
(RANK/WORLD_SIZE as torchrun sets them) and the launch environment (CUDA_DEVICE_MAX_CONNECTIONS).
Only those queries are stood in; nothing opens data or tokenizer files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.stage.checkout import require_checkout_version
from longctx.stage.megatron_args import argv
from longctx.stage.preflight_protocol import (
    Check,
    PreflightReply,
    PreflightRequest,
    StageRequest,
    TargetFacts,
)
from longctx.stage.run import megatron_lm_script

WORKER = "longctx.stage.preflight_worker"
# What longctx's megatron-lm launch sets on top of the job's environment (longctx.stage.run.launch_plan):
# the facts of a launch that is not being prepared right now (`stage args --check`, `slurm submit`).
MEGATRON_LAUNCH_ENV: dict[str, str] = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
# TransformerEngine's version stood in when a target has TE but does not say which
DEFAULT_TE_VERSION = "2.8.0"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class PreflightError(StageError):
    """Megatron-LM (or the model its entry script builds) refuses a stage's argv; `report` says how."""

    def __init__(
        self,
        what: str,
        *,
        where: str | None = None,
        fix: str | None = None,
        report: PreflightReport | None = None,
    ) -> None:
        super().__init__(what, where=where, fix=fix)
        self.report = report


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """The target's devices as Megatron-LM's checks ask for them; `gpu_arch` None: no GPU (CPU facts)."""

    source: str
    gpu_arch: tuple[int, int] | None = (8, 0)
    gpu_name: str | None = None
    gpu_memory_gib: float | None = None
    transformer_engine: str | None = DEFAULT_TE_VERSION  # TE's version, None: absent
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the environment a launch gets

    @classmethod
    def cpu(cls, source: str, env: Mapping[str, str] | None = None) -> DeviceFacts:
        return cls(source, gpu_arch=None, transformer_engine=None, env=dict(env or {}))

    def stand_ins(self) -> list[str]:
        """What the child process is told instead of asking the hardware."""
        if self.gpu_arch is None:
            dev = "torch.cuda: no GPU (is_available False, device_count 0, device queries refused)"
        else:
            a, b = self.gpu_arch
            name = self.gpu_name or f"compute capability {a}.{b}"
            dev = (
                f"torch.cuda: is_available True, device_count = GPUs per node, get_device_properties / "
                f"get_device_capability = {name} ({a}.{b})"
            )
        te = (
            f"TransformerEngine {self.transformer_engine}"
            if self.transformer_engine
            else "TransformerEngine absent"
        )
        cdmc = self.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
        return [
            dev,
            te,
            "RANK=0, LOCAL_RANK=0, WORLD_SIZE = the stage's nodes × GPUs per node",
            f"CUDA_DEVICE_MAX_CONNECTIONS={cdmc}"
            if cdmc is not None
            else "CUDA_DEVICE_MAX_CONNECTIONS unset",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gpu_arch": None if self.gpu_arch is None else ".".join(map(str, self.gpu_arch)),
            "gpu_name": self.gpu_name,
            "gpu_memory_gib": self.gpu_memory_gib,
            "transformer_engine": self.transformer_engine,
            "cuda_device_max_connections": self.env.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "stand_ins": self.stand_ins(),
        }


def parse_arch(text: str | None) -> tuple[int, int] | None:
    """ "8.0" → (8, 0); None/"" → None (no GPU)."""
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise StageError(
            f"GPU arch {text!r} is not a compute capability like 8.0",
            fix='write gpu_arch = "8.0" (A100), "9.0" (H100) or "10.0" (B200)',
        ) from None


@dataclasses.dataclass(frozen=True)
class StageJob:
    """One argv to check (without the script word)."""

    name: str
    argv: list[str]
    world_size: int
    gpus_per_node: int
    rotary_base: float | None = None  # expected; None: whatever --rotary-base says
    seq_length: int | None = None
    rotary: bool = True


@dataclasses.dataclass
class StageReport:
    stage: str
    world_size: int
    checks: list[Check]
    seconds: float
    rotary: dict[str, Any] | None = None
    model_provider: str | None = None
    device_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def passed(self) -> list[str]:
        return [c.name for c in self.checks if c.ok]


@dataclasses.dataclass
class PreflightReport:
    script: str
    facts: DeviceFacts
    stages: list[StageReport]
    seconds: float
    stood_in: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None  # the child process itself failed
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.stages) and all(s.ok for s in self.stages)

    def failures(self) -> list[StageReport]:
        return [s for s in self.stages if not s.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "script": self.script,
            "seconds": round(self.seconds, 2),
            "facts": self.facts.to_json(),
            "stood_in": list(self.stood_in),
            "error": self.error,
            "stages": [
                {
                    "stage": s.stage,
                    "ok": s.ok,
                    "world_size": s.world_size,
                    "seconds": s.seconds,
                    "passed": s.passed(),
                    "model_provider": s.model_provider,
                    "device_calls": s.device_calls,
                    "failure": None if s.failure is None else s.failure.model_dump(),
                    "checks": [c.model_dump() for c in s.checks],
                    "rotary": s.rotary,
                }
                for s in self.stages
            ],
        }

    def lines(self) -> list[str]:
        """A human report: each stage's checks, Megatron's message on failure."""
        out = [f"preflight with {self.script} ({self.facts.source}; {self.seconds:.1f} s)"]
        out += [f"  stood in: {s}" for s in self.facts.stand_ins()]
        for s in self.stages:
            out.append(
                f"{s.stage}: {'passed' if s.ok else 'REFUSED'} ({s.seconds:.1f} s, world size {s.world_size})"
            )
            for c in s.checks:
                mark = "ok  " if c.ok else "FAIL"
                out.append(f"  {mark} {c.name}: {c.detail}")
                if not c.ok and c.message:
                    out.append(f"       Megatron-LM says: {c.message}" + (f" [{c.where}]" if c.where else ""))
        if self.error:
            out.append(f"the preflight process failed: {self.error}")
            if self.log_tail:
                out += ["  " + x for x in self.log_tail.splitlines()[-15:]]
        return out


# -- running ----------------------------------------------------------------------------------------


def run_preflight(
    script: str | os.PathLike[str],
    jobs: Sequence[StageJob],
    facts: DeviceFacts,
    *,
    timeout: float | None = None,
) -> PreflightReport:
    """Check `jobs` against the entry script `script` (pretrain_gpt.py of a checkout) in one child process."""
    script = Path(script)
    if not script.is_file():
        raise StageError(
            f"no entry script {script}",
            where=str(script),
            fix="point $LONGCTX_MEGATRON_LM at a Megatron-LM checkout (the directory with pretrain_gpt.py)",
        )
    t0 = time.monotonic()
    pythonpath = [
        p for p in str(facts.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))).split(os.pathsep) if p
    ]
    limit = timeout if timeout is not None else 240 + 60 * len(jobs)
    with tempfile.TemporaryDirectory(prefix="longctx-preflight-") as tmp:
        req_path, res_path, log_path = (
            Path(tmp, "request.json"),
            Path(tmp, "result.json"),
            Path(tmp, "log.txt"),
        )
        req_path.write_text(_request(script, res_path, pythonpath, jobs, facts).model_dump_json())
        error = _run_worker(req_path, log_path, _worker_env(facts, pythonpath), limit)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        reply, unreadable = _read_reply(res_path)
        error = error or unreadable
    if reply.error:
        error = reply.error
        tail = (reply.traceback or "") + "\n" + tail
    return PreflightReport(
        str(script),
        facts,
        _stage_reports(reply, jobs),
        time.monotonic() - t0,
        list(reply.stood_in),
        error,
        tail,
    )


def _request(
    script: Path, result: Path, pythonpath: list[str], jobs: Sequence[StageJob], facts: DeviceFacts
) -> PreflightRequest:
    cdmc = facts.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    return PreflightRequest(
        script=str(script.resolve()),
        result=str(result),
        sys_path=pythonpath,
        facts=TargetFacts(
            source=facts.source,
            gpu_arch=facts.gpu_arch,
            gpu_name=facts.gpu_name,
            gpu_memory_gib=facts.gpu_memory_gib,
            transformer_engine=facts.transformer_engine,
        ),
        stages=[
            StageRequest(
                stage=j.name,
                argv=list(j.argv),
                world_size=j.world_size,
                gpus_per_node=j.gpus_per_node,
                cuda_device_max_connections=cdmc,
                rotary=j.rotary,
                rotary_base=j.rotary_base,
                seq_length=j.seq_length,
            )
            for j in jobs
        ],
    )


def _worker_env(facts: DeviceFacts, pythonpath: list[str]) -> dict[str, str]:
    # no TransformerEngine attention switches: the rotary check builds a tiny CPU model with megatron-core's
    # own layers and attention backend "auto", which asserts when NVTE_* ask for a particular kernel
    env = {k: v for k, v in {**os.environ, **facts.env}.items() if not k.startswith("NVTE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(_PROJECT_ROOT), *pythonpath])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_worker(req_path: Path, log_path: Path, env: dict[str, str], limit: float) -> str | None:
    """Run the child on the request; its output goes to `log_path`. What went wrong with it (None: nothing)."""
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", WORKER, str(req_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=limit,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"no answer within {limit:.0f} s"
    return f"exit {proc.returncode}" if proc.returncode != 0 else None


def _read_reply(path: Path) -> tuple[PreflightReply, str | None]:
    """The child's reply, and why there is none (an empty reply then)."""
    if not path.is_file():
        return PreflightReply(), "no result written"
    try:
        return PreflightReply.model_validate(json.loads(path.read_text())), None
    except ValueError as err:  # a child cut off mid-write, or another longctx's
        return PreflightReply(), f"an unreadable result ({str(err).splitlines()[0]})"


def _stage_reports(reply: PreflightReply, jobs: Sequence[StageJob]) -> list[StageReport]:
    return [
        StageReport(
            stage=s.stage,
            world_size=next((j.world_size for j in jobs if j.name == s.stage), 0),
            checks=list(s.checks),
            seconds=s.seconds,
            rotary=s.rotary,
            model_provider=s.model_provider,
            device_calls=dict(s.device_calls),
            traceback=s.traceback,
        )
        for s in reply.stages
    ]


def stage_job(rp: ResolvedPlan, st: ResolvedStage, *, rotary: bool = True) -> StageJob:
    """The stage's exact argv (longctx.stage.megatron_args) and what its model must apply."""
    return StageJob(
        st.name,
        argv(rp, st)[1:],
        st.world,
        st.gpus_per_node,
        rotary_base=float(st.rotary_base),
        seq_length=st.seq_length,
        rotary=rotary,
    )


def preflight_plan(
    rp: ResolvedPlan,
    facts: DeviceFacts,
    *,
    stages: Sequence[str] | None = None,
    script: str | os.PathLike[str] | None = None,
    rotary: bool = True,
) -> PreflightReport:
    """Every stage of the plan (or the named ones) through the checkout's Megatron-LM, in one child process
    (a stage whose RoPE sweep is pending: its branches)."""
    if script is None:
        script = megatron_lm_script(rp)
        require_checkout_version(rp, Path(script).parent)
    chosen = rp.launchable(stages)  # a stage pending its RoPE sweep: its branches
    return run_preflight(script, [stage_job(rp, st, rotary=rotary) for st in chosen], facts)


def require_passed(report: PreflightReport, *, where: str | None = None) -> PreflightReport:
    """The report, or PreflightError quoting Megatron-LM's message for the first refused stage."""
    if report.ok:
        return report
    if report.error is not None:
        raise PreflightError(
            f"the Megatron-LM preflight did not finish ({report.error}); last lines: "
            + " | ".join(report.log_tail.splitlines()[-3:]),
            where=report.script,
            fix="run `longctx stage args PLAN STAGE --check` to see the whole report",
            report=report,
        )
    bad = report.failures()[0]
    c = bad.failure
    assert c is not None
    return _raise(report, bad, c, where)


def _raise(report: PreflightReport, bad: StageReport, c: Check, where: str | None) -> PreflightReport:
    fixes = {
        "entry-script": "check the Megatron-LM checkout ($LONGCTX_MEGATRON_LM): its pretrain_gpt.py must import",
        "parse_args": "drop or rename the flag (stage extra_args / [megatron].performance_args); this checkout "
        "does not know it — or set [megatron].version to the version the cluster runs",
        "validate_args": "change the plan (parallel layout, nodes, flags) or the launch environment so that "
        "Megatron-LM's validator accepts it",
        "transformer_config": "disable the fusion (e.g. --no-rope-fusion in [megatron].performance_args) or run "
        "where TransformerEngine is installed (profile transformer_engine)",
        "transformer_impl": "add --transformer-impl local to [megatron].performance_args, or use a profile whose "
        "nodes have TransformerEngine",
        "rotary": "use an entry script whose model class passes --rotary-base to RotaryEmbedding (upstream "
        "pretrain_gpt.py does), or patch the fork's model class",
    }
    others = [s.stage for s in report.failures()[1:]]
    raise PreflightError(
        f"Megatron-LM refuses stage {bad.stage} at {c.name}: {c.message or c.detail}"
        + (f" (also refused: {', '.join(others)})" if others else ""),
        where=where or c.where or report.script,
        fix=fixes.get(c.name, "see the preflight report"),
        report=report,
    )
