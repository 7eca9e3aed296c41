"""Megatron mapping: the flags a version honours, and a refusal with the reason for what it ignores."""

from __future__ import annotations

import re

import pytest

from longctx.errors import RopeError
from longctx.rope import (
    RopeScaling,
    check_conflicting_flags,
    choose_base,
    megatron_core_rope_kwargs,
    megatron_rope_flags,
)
from longctx.rope.megatron import parse_version

LLAMA = dict(rotary_dim=128, pretrain_base=10_000, pretrain_length=4_096)


@pytest.mark.parametrize("method", ["fixed", "abf", "men", "men-safe", "liu", "ntk"])
@pytest.mark.parametrize("version", ["0.16.1", "0.19.2"])
def test_base_methods_map_to_an_integer_rotary_base(method: str, version: str) -> None:
    extra = {"base": 1_000_000} if method == "fixed" else {}
    choice = choose_base(method, target_length=16_384, with_diagnostics=False, **LLAMA, **extra)
    flags = megatron_rope_flags(choice, version)
    assert flags == ["--position-embedding-type", "rope", "--rotary-base", str(choice.base)]
    assert flags[-1].isdigit()  # never 1e6


def test_ntk_base_is_rounded_for_megatron() -> None:
    choice = choose_base("ntk", target_length=16_384, **LLAMA)
    assert megatron_rope_flags(choice, "0.16.1")[-1] == "40890"


def test_yarn_needs_0_19() -> None:
    choice = choose_base(
        "yarn",
        rotary_dim=128,
        pretrain_base=1_000_000,
        pretrain_length=32_768,
        target_length=131_072,
        with_diagnostics=False,
    )
    with pytest.raises(RopeError, match=re.escape("exist for GPT only from megatron-core 0.19.0")) as err:
        megatron_rope_flags(choice, "0.16.1")
    assert err.value.where == "Megatron-LM 0.16.1"
    assert megatron_rope_flags(choice, "0.19.2") == [
        "--position-embedding-type",
        "yarn",
        "--rotary-base",
        "1000000",
        "--rotary-scaling-factor",
        "4",
        "--yarn-original-max-position-embeddings",
        "32768",
        "--yarn-beta-fast",
        "32",
        "--yarn-beta-slow",
        "1",
        "--mscale",
        "1",
        "--mscale-all-dim",
        "0",
    ]


def test_yarn_refuses_partial_rotary() -> None:
    choice = choose_base(
        "yarn",
        rotary_dim=64,
        head_dim=128,
        pretrain_base=10_000,
        pretrain_length=4_096,
        target_length=16_384,
        with_diagnostics=False,
    )
    with pytest.raises(RopeError, match="ignores rotary_percent"):
        megatron_rope_flags(choice, "0.19.2")


def test_linear_needs_0_19_and_an_integer_factor() -> None:
    choice = choose_base("linear", target_length=16_384, with_diagnostics=False, **LLAMA)
    with pytest.raises(RopeError, match=re.escape("does not reach GPT models before megatron-core 0.19.0")):
        megatron_rope_flags(choice, "0.16.1")
    assert megatron_rope_flags(choice, "0.19.0")[-2:] == ["--rotary-seq-len-interpolation-factor", "4"]
    odd = choose_base("linear", target_length=16_384, factor=2.5, with_diagnostics=False, **LLAMA)
    with pytest.raises(RopeError, match=re.escape("factor 2.5 is not an integer")):
        megatron_rope_flags(odd, "0.19.2")


def test_llama3_only_with_megatrons_hard_coded_constants() -> None:
    llama31 = choose_base(
        "llama3",
        rotary_dim=128,
        pretrain_base=500_000,
        pretrain_length=8_192,
        target_length=131_072,
        with_diagnostics=False,
    )
    assert megatron_rope_flags(llama31, "0.16.1") == [
        "--position-embedding-type",
        "rope",
        "--rotary-base",
        "500000",
        "--use-rope-scaling",
    ]
    factor16 = choose_base(
        "llama3",
        rotary_dim=128,
        pretrain_base=500_000,
        pretrain_length=8_192,
        target_length=131_072,
        factor=16,
        with_diagnostics=False,
    )
    with pytest.raises(RopeError, match="--rope-scaling-factor is ignored by pretrain_gpt"):
        megatron_rope_flags(factor16, "0.19.2")
    from4k = choose_base("llama3", target_length=16_384, with_diagnostics=False, **LLAMA)
    with pytest.raises(RopeError, match=r"original_length 4096 \(Megatron: 8192\)"):
        megatron_rope_flags(from4k, "0.19.2")
    # megatron-core itself takes the factor (local backend), but not other constants
    assert megatron_core_rope_kwargs(factor16, "0.16.1")["rope_scaling_factor"] == 16.0
    with pytest.raises(RopeError, match="hard-codes"):
        megatron_core_rope_kwargs(from4k, "0.16.1")


def test_core_kwargs_for_the_local_backend() -> None:
    base = choose_base("men-safe", target_length=131_072, with_diagnostics=False, **LLAMA)
    assert megatron_core_rope_kwargs(base, "0.16.1") == {
        "position_embedding_type": "rope",
        "rotary_base": 31_000_000,
        "rope_scaling": False,
        "seq_len_interpolation_factor": None,
        "config": {},
    }
    pi = choose_base("linear", target_length=16_384, factor=2.5, with_diagnostics=False, **LLAMA)
    assert megatron_core_rope_kwargs(pi, "0.16.1")["seq_len_interpolation_factor"] == 2.5
    yarn = megatron_core_rope_kwargs(RopeScaling("yarn", 4.0, 32_768), "0.16.1", base=1_000_000)
    assert yarn["position_embedding_type"] == "yarn"
    assert (
        yarn["config"]["yarn_rotary_scaling_factor"] == 4.0 and yarn["config"]["yarn_mscale_all_dim"] == 0.0
    )


def test_scaling_alone_needs_a_base() -> None:
    with pytest.raises(RopeError, match="a scaling needs the base it applies to"):
        megatron_rope_flags(RopeScaling("linear", 4.0, 4096), "0.19.2")
    assert megatron_rope_flags(RopeScaling("linear", 4.0, 4096), "0.19.2", base=10_000)[3] == "10000"


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.16.1", (0, 16, 1)), ("v0.19.0rc1", (0, 19, 0)), ("0.20.0.dev0", (0, 20, 0)), ("1.2", (1, 2, 0))],
)
def test_parse_version(text: str, version: tuple[int, int, int]) -> None:
    assert parse_version(text) == version


def test_bad_version() -> None:
    with pytest.raises(RopeError, match="cannot read a megatron-core version from 'latest'"):
        megatron_rope_flags(
            choose_base("abf", target_length=16_384, with_diagnostics=False, **LLAMA), "latest"
        )


def test_use_checkpoint_args_conflicts_with_a_new_base() -> None:
    choice = choose_base("men-safe", target_length=16_384, with_diagnostics=False, **LLAMA)
    argv = ["--load", "/ckpt", "--use-checkpoint-args", *megatron_rope_flags(choice, "0.16.1")]
    with pytest.raises(RopeError, match="--use-checkpoint-args conflicts with men-safe base 1,200,000"):
        check_conflicting_flags(argv, choice)
    check_conflicting_flags(argv[:2], choice)
    keep = choose_base("fixed", base=10_000, target_length=16_384, with_diagnostics=False, **LLAMA)
    check_conflicting_flags(argv, keep)  # nothing to undo


@pytest.mark.parametrize("version", ["0.20.0", "0.20.0rc0", "1.2", "99.0.0"])
def test_a_release_newer_than_the_table_is_refused(version: str) -> None:
    from longctx.errors import StageError
    from longctx.megatron_versions import facts

    with pytest.raises(
        StageError, match=r"newer than any release longctx knows \(the newest is 0\.19\)"
    ) as err:
        facts(version)
    assert err.value.fix and "0.19.x" in err.value.fix
    assert facts("0.19.7").label == "0.19.7"  # a patch release of a known minor is that minor


@pytest.mark.parametrize("text", ["9" * 5000 + ".1.0", "0." + "1" * 5000, "1.2.3" + "4" * 10])
def test_a_version_of_absurd_digits_is_unreadable(text: str) -> None:
    from longctx.errors import StageError
    from longctx.megatron_versions import parse_version

    with pytest.raises(StageError, match="cannot read a Megatron-LM version") as err:
        parse_version(text)
    assert len(err.value.what) < 200
