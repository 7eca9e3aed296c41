"""Which device a rank computes on and where its collectives' tensors live, decided and refused on CPU."""

from __future__ import annotations

import pytest
import torch

from longctx.errors import ParallelError
from longctx.mcore import parallel
from longctx.train import signals


def test_nccl_collectives_take_cuda_tensors_and_gloo_cpu() -> None:
    # NCCL has no CPU path: a CPU tensor all-reduced on it fails with "No backend type associated with
    # device type cpu", even at world size 1
    assert parallel.backend_device("nccl").type == "cuda"
    assert parallel.backend_device("gloo").type == "cpu"


def test_reductions_follow_the_group_backend() -> None:
    # NCCL (CUDA tensors) where this process computes on a GPU, gloo (CPU tensors) elsewhere
    want = "cuda" if torch.cuda.is_available() else "cpu"
    with parallel.eval_parallel(1):
        assert parallel.collective_device().type == want
        assert parallel.training_device().type == want
        assert signals.agree(True) is True


@pytest.mark.parametrize(
    ("env", "visible", "built", "available", "expect"),
    [
        ({}, True, True, False, "cannot use the NVIDIA GPU"),  # driver older than torch's CUDA
        ({}, True, False, False, "CPU-only build"),
        ({"CUDA_VISIBLE_DEVICES": ""}, True, True, False, None),  # GPUs hidden on purpose
        ({"CUDA_VISIBLE_DEVICES": "-1"}, True, False, False, None),
        ({}, False, True, False, None),  # no NVIDIA device: a CPU machine
        ({}, True, True, True, None),
    ],
)
def test_unusable_cuda_is_named(
    env: dict, visible: bool, built: bool, available: bool, expect: str | None
) -> None:
    reason = parallel.cuda_unusable_reason(env, visible, built, available)
    assert reason is None if expect is None else expect in reason


def test_unusable_cuda_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_nvidia_visible", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if torch.cuda.is_available():
        pytest.skip("this machine's CUDA works")
    with pytest.raises(ParallelError) as err:
        parallel.training_device()
    assert "CUDA_VISIBLE_DEVICES=''" in err.value.fix


def test_more_ranks_than_gpus_is_refused() -> None:
    parallel.check_local_rank(0, 1)
    with pytest.raises(
        ParallelError, match="local rank 1 has no GPU of its own: this node shows 1 GPU"
    ) as err:
        parallel.check_local_rank(1, 1)
    assert "at most 1 process" in err.value.fix
