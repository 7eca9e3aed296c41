"""One exception type per domain, each carrying what went wrong, where, and how to fix it.

The CLI renders these as a short red message and exits with code 2; library callers can catch the
domain type (or `LongctxError`) and read the three fields.
"""

from __future__ import annotations

import signal


class LongctxError(Exception):
    """Base of every error longctx raises on purpose."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"[{self.where}]")
        text = " ".join(parts)
        if self.fix:
            text += f" — fix: {self.fix}"
        return text

    def to_json(self) -> dict[str, str | None]:
        return {"type": type(self).__name__, "what": self.what, "where": self.where, "fix": self.fix}


class TokenizerError(LongctxError):
    """A tokenizer file or manifest cannot be read."""


class TokenizerMismatch(TokenizerError):
    """A tokenizer differs from what its manifest (or md5) promises."""


class DatasetError(LongctxError):
    """A Megatron indexed dataset, blend or dataset artifact is malformed or unsuitable."""


class CheckpointError(LongctxError):
    """A checkpoint is missing, incomplete, corrupt or unsafe to read."""


class RopeError(LongctxError, ValueError):
    """RoPE inputs that cannot give a meaningful base."""


class AttentionError(LongctxError, ValueError):
    """Tensors that the attention kernels cannot take (shapes, devices, groups)."""


class PlanError(LongctxError):
    """A stage plan that is malformed or cannot work."""


class StageError(LongctxError):
    """A stage cannot be launched or resumed as asked."""


class TrainError(LongctxError):
    """The local trainer cannot run as configured."""


class SlurmError(LongctxError):
    """A Slurm profile, rendering or submission problem."""


class EvalError(LongctxError):
    """An evaluation cannot run as asked."""


class ParallelError(LongctxError):
    """torch.distributed / megatron model-parallel state that does not fit what was asked."""


class OutputError(LongctxError):
    """An output path that would land on (or inside) an input the command reads."""


class ExportError(LongctxError):
    """A checkpoint cannot be exported as asked (unmapped architecture, wrong stage, bad output, …)."""


class FileSystemError(LongctxError):
    """The operating system refused a read or write (read-only, full, no permission, a loop)."""


class Interrupted(LongctxError):
    """A signal (SIGTERM, SIGINT, SIGUSR1) asked a command to stop; what it started has stopped too.

    Not a refusal: the CLI exits with the shell's code for the signal (128 + its number), so a script,
    `timeout` or a scheduler sees that it was stopped, not that it failed or finished."""

    def __init__(
        self, signum: int, what: str = "", *, where: str | None = None, fix: str | None = None
    ) -> None:
        self.signum = signum
        said = f"stopped by {_signal_name(signum)}" + (f": {what}" if what else "")
        super().__init__(
            said, where=where, fix=fix or "run the same command again: it resumes from what was saved"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
