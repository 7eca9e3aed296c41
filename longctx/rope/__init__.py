"""RoPE base planning: methods that pick a rotary base, diagnostics, Megatron flag mapping, plots.

    from longctx.rope import choose_base, diagnose, megatron_rope_flags
    choice = choose_base("men-safe", rotary_dim=128, pretrain_base=100_000, pretrain_length=4096,
                         target_length=131072)
    choice.base                  # 31000000
    megatron_rope_flags(choice, "0.16.1")
    # ['--position-embedding-type', 'rope', '--rotary-base', '31000000']

Plans name a method per stage; `METHODS` lists them with their parameters and `validate_method`
checks a name and its parameters.
"""

from longctx.rope.checkpoint_args import RopeModelArgs, rope_args_from_checkpoint_args
from longctx.rope.cossum import cos_sum, cos_sum_scan, first_failing_position, inv_freq, men_exact_bound
from longctx.rope.diagnostics import RopeDiagnostics, diagnose
from longctx.rope.formulas import MEN_PAPER_TABLE, men_fit, men_paper, round_sig
from longctx.rope.megatron import (
    CONFLICTING_FLAGS,
    check_conflicting_flags,
    megatron_core_rope_kwargs,
    megatron_rope_flags,
)
from longctx.rope.methods import (
    BASE_METHODS,
    METHODS,
    SCALING_METHODS,
    BaseChoice,
    Method,
    Param,
    RopeInputs,
    choose_base,
    get_method,
    validate_inputs,
    validate_method,
)
from longctx.rope.scaling import RopeScaling
from longctx.rope.suggest import LengthSuggestion, Suggestion, suggest

__all__ = [
    "BASE_METHODS",
    "CONFLICTING_FLAGS",
    "MEN_PAPER_TABLE",
    "METHODS",
    "SCALING_METHODS",
    "BaseChoice",
    "LengthSuggestion",
    "Method",
    "Param",
    "RopeDiagnostics",
    "RopeInputs",
    "RopeModelArgs",
    "RopeScaling",
    "Suggestion",
    "check_conflicting_flags",
    "choose_base",
    "cos_sum",
    "cos_sum_scan",
    "diagnose",
    "first_failing_position",
    "get_method",
    "inv_freq",
    "megatron_core_rope_kwargs",
    "megatron_rope_flags",
    "men_exact_bound",
    "men_fit",
    "men_paper",
    "rope_args_from_checkpoint_args",
    "round_sig",
    "suggest",
    "validate_inputs",
    "validate_method",
]
