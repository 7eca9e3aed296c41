"""A stage's peak memory on the CPU counts what training grew by, even below an earlier transient peak."""

from __future__ import annotations

import torch

from longctx.mcore.metrics import peak_memory_bytes, start_memory_peak

MIB = 1 << 20


def test_growth_after_the_start_shows_under_a_larger_peak_before_it() -> None:
    cpu = torch.device("cpu")
    transient = torch.ones(64 * MIB)  # 256 MiB, then freed: as an import's transient peak would be
    del transient
    before = start_memory_peak(cpu)
    # 64 MiB that stay, as a small model's would: above malloc's largest mmap threshold (32 MiB), so
    # fresh pages, never resident pages the heap kept from earlier tests
    grown = torch.ones(16 * MIB)
    growth = peak_memory_bytes(cpu) - before
    assert 56 * MIB <= growth < 256 * MIB, growth / MIB
    del grown
