"""Slurm's time and signal formats: `--time` strings to seconds and back, `--signal` specs."""

from __future__ import annotations

import dataclasses
import re

from longctx.errors import SlurmError

_TIME_FORMS = (
    (re.compile(r"^(\d+)$"), lambda m: int(m[1]) * 60),
    (re.compile(r"^(\d+):(\d+)$"), lambda m: int(m[1]) * 60 + int(m[2])),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), lambda m: int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])),
    (re.compile(r"^(\d+)-(\d+)$"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60),
    (
        re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"),
        lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]),
    ),
)

# signals the trainers turn into "save and exit": Megatron-LM's --exit-signal choices, and the local trainer's
SIGNALS = {"TERM": 15, "INT": 2, "USR1": 10, "USR2": 12}


def parse_time(text: str, where: str = "time") -> int:
    """Slurm time limit → seconds: "90", "1:30", "24:00:00", "1-12", "4-00:00:00"."""
    s = str(text).strip()
    for pattern, seconds in _TIME_FORMS:
        m = pattern.match(s)
        if m:
            value = seconds(m)
            if value <= 0:
                break
            return value
    raise SlurmError(
        f"{s!r} is not a Slurm time limit",
        where=where,
        fix='write minutes ("90"), "HH:MM:SS" ("24:00:00") or "D-HH:MM:SS" ("4-00:00:00")',
    )


def format_seconds(seconds: float) -> str:
    """Seconds → "D-HH:MM:SS" / "HH:MM:SS" (for messages and status)."""
    s = max(0, round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


@dataclasses.dataclass(frozen=True)
class SignalSpec:
    """`--signal=[R:]SIG[@SECONDS]`: SIG is sent to every job step SECONDS before the time limit."""

    name: str
    seconds: int
    reservation: bool = False

    def directive(self) -> str:
        return f"{'R:' if self.reservation else ''}{self.name}@{self.seconds}"


def parse_signal(text: str, where: str = "signal") -> SignalSpec:
    s = str(text).strip()
    m = re.match(r"^(?:([A-Za-z]+):)?([A-Za-z0-9]+)(?:@(\d+))?$", s)
    if not m:
        raise SlurmError(f"{s!r} is not a Slurm --signal value", where=where, fix='write it as "TERM@240"')
    flags, sig, secs = (m[1] or "").upper(), m[2].upper(), m[3]
    if "B" in flags:
        raise SlurmError(
            f"--signal={s}: 'B:' signals only the batch shell, which never passes it to srun, torchrun or "
            "the trainer, so nothing would save",
            where=where,
            fix=f"drop 'B:' (write {sig}@{secs or 60}): without it Slurm signals every job step",
        )
    if flags not in ("", "R"):
        raise SlurmError(f"--signal={s}: unknown flag {flags!r}", where=where, fix="only 'R:' is allowed")
    if sig.startswith("SIG"):
        sig = sig[3:]
    if sig.isdigit():
        by_number = {v: k for k, v in SIGNALS.items()}
        if int(sig) not in by_number:
            raise SlurmError(
                f"--signal={s}: signal {sig} is not one the trainers save on",
                where=where,
                fix=f"use one of {', '.join(SIGNALS)}",
            )
        sig = by_number[int(sig)]
    if sig not in SIGNALS:
        raise SlurmError(
            f"--signal={s}: {sig} is not a signal the trainers save on",
            where=where,
            fix=f"use one of {', '.join(SIGNALS)} (TERM is what Megatron-LM's --exit-signal-handler "
            "and the local trainer handle by default)",
        )
    seconds = int(secs) if secs is not None else 60  # Slurm's default lead time
    if seconds <= 0 or seconds > 65535:
        raise SlurmError(
            f"--signal={s}: the lead time must be 1–65535 seconds", where=where, fix='write e.g. "TERM@240"'
        )
    return SignalSpec(sig, seconds, reservation="R" in flags)
