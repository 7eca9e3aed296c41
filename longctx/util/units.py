"""Human-readable sizes for reports."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_length(n: int) -> str:
    """Context lengths as plans write them: 4096 → 4K, 1000 → 1000."""
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)
