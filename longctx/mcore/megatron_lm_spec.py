"""The layer spec for Megatron-LM's `--spec longctx.mcore.megatron_lm_spec layer_spec`.

Megatron-LM's local (`--transformer-impl local`) `DotProductAttention` refuses context parallelism
("Context parallelism is only supported by TEDotProductAttention!"), so without TransformerEngine the
real `pretrain_gpt.py` cannot run `--context-parallel-size` > 1. `gpt_builders.gpt_builder` accepts
`--spec MODULE NAME` and uses that object as the transformer layer spec; this module's `layer_spec` is
megatron-core's local GPT layer spec with `LongctxCoreAttention` (longctx's ring / all-gather
attention) as core attention, built from the run's own arguments.

How Megatron-LM reads it (gpt_builders.py at core_v0.16.1): `import_module(args.spec)` is
`vars(__import__(MODULE))[NAME]` — the object is taken as it is, **not called**, inside `gpt_builder`
(after the arguments are parsed). `layer_spec` is therefore a `ModuleSpec` (a TransformerLayer spec)
whose submodules are built on first use from `megatron.training.get_args()`: normalization,
qk-layernorm / qk-l2-norm and the MoE options, exactly as Megatron's own local spec would get them.
Importing this module before the arguments are parsed is harmless.

`layer_spec_from_args(args)` builds the same spec for given arguments (any object with Megatron's
argument names). Options the local spec cannot honour with this attention are refused here, at model
build time, rather than silently ignored: multi-latent attention and experimental attention variants.
"""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer

from longctx.attention.megatron_adapter import longctx_local_layer_spec
from longctx.errors import AttentionError

_WHERE = "longctx.mcore.megatron_lm_spec"


def layer_spec_from_args(args: Any) -> ModuleSpec:
    """The local GPT layer spec with LongctxCoreAttention, for Megatron-LM's parsed `args`."""
    for name, why in (
        ("multi_latent_attention", "multi-latent attention has different q/k and v head dims"),
        ("experimental_attention_variant", "experimental attention variants replace the core attention"),
    ):
        if getattr(args, name, None):
            raise AttentionError(
                f"--spec {_WHERE} layer_spec cannot build a model with {name}={getattr(args, name)!r}: {why}",
                where=_WHERE,
                fix="drop the option, or use TransformerEngine's spec (no --spec) on a GPU",
            )
    return longctx_local_layer_spec(
        num_experts=getattr(args, "num_experts", None),
        moe_grouped_gemm=bool(getattr(args, "moe_grouped_gemm", False)),
        qk_layernorm=bool(getattr(args, "qk_layernorm", False)),
        moe_use_legacy_grouped_gemm=bool(getattr(args, "moe_use_legacy_grouped_gemm", False)),
        normalization=getattr(args, "normalization", None),
        qk_l2_norm=bool(getattr(args, "qk_l2_norm", False)),
    )


# printed (with `describe(args)`) when Megatron-LM builds its layers from `layer_spec`
BUILT_MESSAGE = "--spec layer_spec: megatron-core local GPT layers with LongctxCoreAttention"


def describe(args: Any) -> str:
    """The arguments the spec follows, and the context parallelism the attention will run."""
    names = ("context_parallel_size", "cp_comm_type", "normalization", "qk_layernorm", "num_experts")
    return ", ".join(f"{n}={getattr(args, n, None)}" for n in names)


def _megatron_args() -> Any:
    try:
        from megatron.training.global_vars import get_args
    except ImportError as e:  # pragma: no cover - megatron-core alone, no Megatron-LM checkout
        raise AttentionError(
            f"{_WHERE}.layer_spec is built from Megatron-LM's arguments, but megatron.training is missing",
            where=_WHERE,
            fix="call layer_spec_from_args(args) yourself, or put the Megatron-LM checkout on sys.path",
        ) from e
    try:
        return get_args()
    except AssertionError as e:  # get_args asserts `args is not None`
        raise AttentionError(
            f"{_WHERE}.layer_spec was used before Megatron-LM parsed its arguments",
            where=_WHERE,
            fix="pass it through `--spec longctx.mcore.megatron_lm_spec layer_spec`, or call "
            "layer_spec_from_args(args)",
        ) from e


class ArgsLayerSpec(ModuleSpec):
    """A TransformerLayer `ModuleSpec` whose submodules come from Megatron-LM's parsed arguments.

    Megatron-LM takes the `--spec` object without calling it, so the arguments it must follow are read
    when the model is built (first access of `submodules`), not when this module is imported. An
    explicitly assigned, non-None `submodules` takes precedence.
    """

    def __init__(self) -> None:
        self._built: ModuleSpec | None = None
        self._assigned: Any = None
        super().__init__(module=TransformerLayer)

    @property  # type: ignore[override]
    def submodules(self) -> Any:
        if self._assigned is not None:
            return self._assigned
        if self._built is None:
            args = _megatron_args()
            self._built = layer_spec_from_args(args)
            print(f"[longctx] {BUILT_MESSAGE} ({describe(args)})", flush=True)
        return self._built.submodules

    @submodules.setter
    def submodules(self, value: Any) -> None:
        self._assigned = value


# the object `--spec longctx.mcore.megatron_lm_spec layer_spec` names
layer_spec = ArgsLayerSpec()

__all__ = ["BUILT_MESSAGE", "ArgsLayerSpec", "describe", "layer_spec", "layer_spec_from_args"]
