"""A RoPE choice as Megatron settings, refusing what a Megatron version would silently ignore.

Facts this rests on (Megatron-LM / megatron-core sources):
- `--rotary-base` is `type=int`; every version honours it for GPT with `--position-embedding-type rope`.
- `--use-checkpoint-args` force-overrides `rotary_base`, `rotary_percent` and `position_embedding_type`
  with the checkpoint's values, silently undoing a new base.
- `--use-rope-scaling` reaches GPT, but `--rope-scaling-factor` does not (the GPT builder passes only
  the switch), so the factor stays at RotaryEmbedding's default 8; low/high frequency factors 1/4 and
  the original length 8192 are hard-coded.
- `--rotary-seq-len-interpolation-factor` (int) reaches GPT only from 0.19.0.
- YaRN for GPT on the command line (`--position-embedding-type yarn` and the `--yarn-*` flags) exists
  from 0.19.0. YarnRotaryEmbedding computes its frequencies over kv_channels, ignoring rotary_percent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from longctx.errors import RopeError, StageError
from longctx.megatron_versions import facts
from longctx.megatron_versions import parse_version as _parse_version
from longctx.rope.methods import BaseChoice
from longctx.rope.scaling import RopeScaling

# Which release's GPT command line takes YaRN and the PI interpolation factor: the release table
# (longctx.megatron_versions, `facts(v).cli_yarn` / `.cli_pi`), checked against 0.19's source by
# tests/stage/test_versions_source.py.
#: First megatron-core version checked to build GPTModel with YaRN (position_embedding_type "yarn").
CORE_YARN_MIN = (0, 16, 0)
#: Megatron's hard-coded llama3 constants (only the factor is a constructor argument).
MEGATRON_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_length": 8192}
#: The factor GPT gets from `--use-rope-scaling`, whatever `--rope-scaling-factor` says.
MEGATRON_LLAMA3_CLI_FACTOR = 8.0

#: Flags that must not accompany a changed base, and why.
CONFLICTING_FLAGS: dict[str, str] = {
    "--use-checkpoint-args": (
        "it force-overrides --rotary-base, --rotary-percent and --position-embedding-type with the "
        "checkpoint's values, so the new base would silently be the old one"
    ),
}


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.16.1', 'v0.19.0rc1', '0.20.0.dev0' → (major, minor, patch)."""
    try:
        return _parse_version(text)
    except StageError:
        raise RopeError(
            f"cannot read a megatron-core version from {text!r}",
            fix="pass a version like 0.16.1 (megatron/core/package_info.py of the Megatron-LM checkout)",
        ) from None


def _num(value: float) -> str:
    """Integers without a decimal point, other floats in their shortest form."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _unpack(
    choice: BaseChoice | RopeScaling, base: int | None, full_rotary: bool | None
) -> tuple[str, int, RopeScaling | None, bool]:
    if isinstance(choice, BaseChoice):
        full = choice.inputs.head_dim is None if full_rotary is None else full_rotary
        return choice.method, choice.base, choice.scaling, full
    if isinstance(choice, RopeScaling):
        if base is None:
            raise RopeError("a scaling needs the base it applies to", fix="pass base=<int>")
        return choice.type, int(base), choice, True if full_rotary is None else full_rotary
    raise RopeError(f"expected a BaseChoice or RopeScaling, got {type(choice).__name__}")


def _refuse(what: str, version: str, fix: str) -> RopeError:
    return RopeError(what, where=f"Megatron-LM {version}", fix=fix)


def megatron_rope_flags(
    choice: BaseChoice | RopeScaling,
    megatron_core_version: str,
    *,
    base: int | None = None,
    full_rotary: bool | None = None,
) -> list[str]:
    """Megatron-LM (pretrain_gpt) command-line words for a RoPE choice, one list item per word.

    Only RoPE flags: the argv builder adds --seq-length/--max-position-embeddings and must not add
    `--use-checkpoint-args` (see `check_conflicting_flags`). Raises RopeError, with the reason, for
    settings the given version would ignore or misapply.
    """
    _, rotary_base, scaling, full = _unpack(choice, base, full_rotary)
    return rope_flags(rotary_base, scaling, megatron_core_version, full_rotary=full)


def rope_flags(
    rotary_base: int, scaling: RopeScaling | None, megatron_core_version: str, *, full_rotary: bool
) -> list[str]:
    """The words of `megatron_rope_flags` for a base and an optional scaling, as a planned stage carries
    them (RopeError for what the version would ignore or misapply)."""
    version = parse_version(megatron_core_version)
    v = megatron_core_version
    flags = ["--position-embedding-type", "rope", "--rotary-base", str(int(rotary_base))]
    if scaling is None:
        return flags
    if scaling.type == "linear":
        return [*flags, *_linear_flags(scaling, version, v)]
    if scaling.type == "llama3":
        return [*flags, *_llama3_flags(scaling, v)]
    return _yarn_flags(scaling, rotary_base, full_rotary, version, v)


def _linear_flags(scaling: RopeScaling, version: tuple[int, int, int], v: str) -> list[str]:
    """PI: an integer --rotary-seq-len-interpolation-factor, which reaches GPT from 0.19."""
    if not facts(version).cli_pi:
        raise _refuse(
            "linear interpolation: --rotary-seq-len-interpolation-factor does not reach GPT models "
            "before megatron-core 0.19.0 (the GPT builder does not pass it)",
            v,
            "use a base method (men-safe, abf) or Megatron-LM ≥ 0.19",
        )
    if not float(scaling.factor).is_integer():
        raise _refuse(
            f"linear interpolation factor {scaling.factor:g} is not an integer, and "
            "--rotary-seq-len-interpolation-factor is type=int",
            v,
            "choose an integer factor (target / pretraining length is one for power-of-two stages)",
        )
    return ["--rotary-seq-len-interpolation-factor", _num(scaling.factor)]


def _llama3_flags(scaling: RopeScaling, v: str) -> list[str]:
    """llama3: only --use-rope-scaling reaches GPT, so only Megatron's hard-coded settings are honoured."""
    wanted = {
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_length": scaling.original_length,
    }
    off = [
        f"{k} {_num(val)} (Megatron: {_num(MEGATRON_LLAMA3[k])})"
        for k, val in wanted.items()
        if float(val) != MEGATRON_LLAMA3[k]
    ]
    if off:
        raise _refuse(
            "llama3: Megatron hard-codes low/high frequency factors 1/4 and original length 8192; "
            + "; ".join(off),
            v,
            "use llama3 only for an 8K-pretrained model, or a base method",
        )
    if float(scaling.factor) != MEGATRON_LLAMA3_CLI_FACTOR:
        raise _refuse(
            f"llama3 factor {scaling.factor:g}: --rope-scaling-factor is ignored by pretrain_gpt (the "
            "GPT builder passes only --use-rope-scaling), so GPT always gets factor 8",
            v,
            "use factor 8, or the local backend (megatron-core honours the factor)",
        )
    return ["--use-rope-scaling"]


def _yarn_flags(
    scaling: RopeScaling, rotary_base: int, full: bool, version: tuple[int, int, int], v: str
) -> list[str]:
    """YaRN: its own position-embedding type and --yarn-* flags (from 0.19), full rotary only."""
    if not facts(version).cli_yarn:
        raise _refuse(
            "yarn: --position-embedding-type yarn and the --yarn-* flags exist for GPT only from "
            "megatron-core 0.19.0",
            v,
            "use a base method (men-safe, abf), or Megatron-LM ≥ 0.19",
        )
    if not full:
        raise _refuse(
            "yarn with partial rotary: YarnRotaryEmbedding computes its frequencies over kv_channels and "
            "ignores rotary_percent",
            v,
            "use a base method for partial-rotary models",
        )
    return [
        "--position-embedding-type",
        "yarn",
        "--rotary-base",
        str(int(rotary_base)),
        "--rotary-scaling-factor",
        _num(scaling.factor),
        "--yarn-original-max-position-embeddings",
        str(int(scaling.original_length)),
        "--yarn-beta-fast",
        _num(32.0 if scaling.beta_fast is None else scaling.beta_fast),
        "--yarn-beta-slow",
        _num(1.0 if scaling.beta_slow is None else scaling.beta_slow),
        "--mscale",
        _num(1.0 if scaling.mscale is None else scaling.mscale),
        "--mscale-all-dim",
        _num(0.0 if scaling.mscale_all_dim is None else scaling.mscale_all_dim),
    ]


def megatron_core_rope_kwargs(
    choice: BaseChoice | RopeScaling,
    megatron_core_version: str,
    *,
    base: int | None = None,
    full_rotary: bool | None = None,
) -> dict[str, Any]:
    """GPTModel keyword arguments (and, for YaRN, TransformerConfig attributes under "config") for the
    local backend, which builds megatron-core models directly and so is not limited by the CLI."""
    _, rotary_base, scaling, full = _unpack(choice, base, full_rotary)
    version = parse_version(megatron_core_version)
    v = megatron_core_version
    out: dict[str, Any] = {
        "position_embedding_type": "rope",
        "rotary_base": int(rotary_base),
        "rope_scaling": False,
        "seq_len_interpolation_factor": None,
        "config": {},
    }
    if scaling is None:
        return out
    if scaling.type == "linear":
        out["seq_len_interpolation_factor"] = float(scaling.factor)
        return out
    if scaling.type == "llama3":
        off = [k for k, want in MEGATRON_LLAMA3.items() if float(getattr(scaling, k)) != want]
        if off:
            raise _refuse(
                "llama3: megatron-core hard-codes low/high frequency factors 1/4 and original length 8192 "
                f"({', '.join(off)} differ)",
                f"megatron-core {v}",
                "use llama3 only for an 8K-pretrained model, or a base method",
            )
        out.update(rope_scaling=True, rope_scaling_factor=float(scaling.factor))
        return out
    if version < CORE_YARN_MIN:
        raise _refuse("yarn: not checked for megatron-core before 0.16", v, "use megatron-core ≥ 0.16")
    if not full:
        raise _refuse(
            "yarn with partial rotary: YarnRotaryEmbedding ignores rotary_percent", v, "use a base method"
        )
    out["position_embedding_type"] = "yarn"
    # GPTModel reads these with getattr and no defaults, so every one must be set.
    out["config"] = {
        "yarn_rotary_scaling_factor": float(scaling.factor),
        "yarn_original_max_position_embeddings": int(scaling.original_length),
        "yarn_beta_fast": float(32.0 if scaling.beta_fast is None else scaling.beta_fast),
        "yarn_beta_slow": float(1.0 if scaling.beta_slow is None else scaling.beta_slow),
        "yarn_mscale": float(1.0 if scaling.mscale is None else scaling.mscale),
        "yarn_mscale_all_dim": float(0.0 if scaling.mscale_all_dim is None else scaling.mscale_all_dim),
        "yarn_correction_range_round_to_int": True,
    }
    return out


def check_conflicting_flags(argv: Sequence[str], choice: BaseChoice | None = None) -> None:
    """RopeError when argv holds a flag that would undo the RoPE choice (e.g. --use-checkpoint-args).

    With a choice that keeps the pretraining base and has no scaling, nothing is undone and the flag
    is allowed.
    """
    if choice is not None and choice.scaling is None and choice.base == choice.inputs.pretrain_base:
        return
    for flag, why in CONFLICTING_FLAGS.items():
        if flag in argv:
            what = "a new RoPE base" if choice is None else f"{choice.method} base {choice.base:,}"
            raise RopeError(f"{flag} conflicts with {what}: {why}", fix=f"drop {flag}")


__all__ = [
    "CONFLICTING_FLAGS",
    "check_conflicting_flags",
    "megatron_core_rope_kwargs",
    "megatron_rope_flags",
    "parse_version",
    "rope_flags",
]
