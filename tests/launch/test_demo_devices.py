"""Where `longctx demo` trains: its CP 2 stage needs two ranks, so a one-GPU machine trains on CPU
ranks (each rank would otherwise refuse: see tests/train/test_rank_refusal.py), and says so."""

from __future__ import annotations

from longctx.demo.run import device_choice


def test_one_gpu_and_two_ranks_trains_on_cpu_ranks_and_says_so() -> None:
    env, line = device_choice(1, 2)
    assert env == {"CUDA_VISIBLE_DEVICES": ""}
    assert line.startswith("devices: CPU ranks") and "1 GPU(s)" in line and "2 processes" in line


def test_enough_gpus_or_none_leaves_the_environment_alone() -> None:
    assert device_choice(2, 2) == ({}, "devices: GPU (2 process(es), one GPU each, of 2)")
    assert device_choice(8, 2)[0] == {}
    assert device_choice(None, 2) == ({}, "devices: CPU (2 process(es), no GPU visible)")
    assert device_choice(0, 2)[0] == {}
