"""Which model family a checkpoint holds — autoregressive (ARM), masked diffusion (MDM) or
uniform-state diffusion (UDM), dense or MoE — decided from its tensor keys, shapes and saved args.

Nothing about a family is assumed from a file name. The evidence, each item reported:

* the block prefix: GPTModel stores its layers under `decoder.`, the BERT-derived diffusion models
  under `encoder.` (a bidirectional encoder);
* a [MASK] row: an input embedding one row larger than the output layer, or the `subtokenizer.mask`
  buffer the masked-diffusion models carry — either makes the model a masked-diffusion one;
* saved args of a diffusion fork (`--target-length`, `--padded-input`, `--subtokenizer-type`, …);
* time conditioning (timestep embeddings, adaLN modulation), which longctx's trainer does not build;
* router and expert keys: per-expert (`local_experts.{e}.…`) or stacked `experts.experts.…` [E, …]
  (megatron-core's dist-checkpoint form for both its sequential and its grouped-GEMM experts).

What the weights cannot decide is said as such: a UDM's objective (its corruption and bound) is never
in the weights, so an encoder without a mask row is reported as "UDM, objective unknown — pass
`objective = "udm"` in the plan"; a GPT-layout model without any diffusion evidence is ARM by
default, with the note that a diffusion model saved in the GPT layout would look the same.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from longctx.checkpoint.keys import model_entries
from longctx.objective import ObjectiveKind
from longctx.report import Findings

Family = Literal["ARM", "MDM", "UDM"]

MASK_BUFFER = "subtokenizer.mask"
LOOKUP_BUFFER = "subtokenizer.lookup_table"
# Megatron's default --make-vocab-size-divisible-by: a vocabulary not a multiple of it was not padded
VOCAB_PAD_MULTIPLE = 128
# args a diffusion fork of Megatron-LM adds to its entry script (and pretrain_gpt.py does not know)
DIFFUSION_ARGS = (
    "target_length", "padded_input", "padded_output", "subtokenizer_type", "random_ratio", "embedding_type",
    "scheduling_type", "scheduling_scale",
)  # fmt: skip
_TIME_KEY = re.compile(
    r"(?:^|\.)(?:time_embed\w*|t_embedder\w*|timestep\w*|adaLN\w*|adaln\w*|sigma_map\w*)\."
)
_LAYER = re.compile(r"^(decoder|encoder)\.layers\.(?:(\d+)\.)?(.+)$")
# what a megatron-core GPT layer (local or TransformerEngine spec, dense or MoE) stores below a layer
_KNOWN_LAYER_KEY = re.compile(
    r"^(?:input_layernorm|pre_mlp_layernorm)\.(?:weight|bias)$"
    r"|^self_attention\.(?:linear_qkv|linear_proj)\.(?:weight|bias|layer_norm_weight|layer_norm_bias|_extra_state)$"
    r"|^self_attention\.(?:q_layernorm|k_layernorm|kv_layernorm)\.(?:weight|bias)$"
    # multi-latent attention (MLA)
    r"|^self_attention\.linear_(?:q_proj|q_down_proj|q_up_proj|kv_down_proj|kv_up_proj)"
    r"\.(?:weight|bias|layer_norm_weight|layer_norm_bias|_extra_state)$"
    r"|^self_attention\.core_attention\._extra_state$"
    r"|^mlp\.(?:linear_fc1|linear_fc2)\.(?:weight|bias|layer_norm_weight|layer_norm_bias|_extra_state)$"
    r"|^mlp\.router\.(?:weight|bias|expert_bias|local_tokens_per_expert)$"
    r"|^mlp\.experts\.local_experts\.\d+\.(?:linear_fc1|linear_fc2)\.(?:weight|bias|_extra_state)$"
    r"|^mlp\.experts\.(?:experts\.)?(?:linear_fc1|linear_fc2)\.(?:weight|bias)\d*$"
    r"|^mlp\.experts\.(?:linear_fc1|linear_fc2)\._extra_state$"
    r"|^mlp\.shared_experts\.(?:linear_fc1|linear_fc2|gate_weight)(?:\.(?:weight|bias|_extra_state))?$"
)
_KNOWN_TOP_KEY = re.compile(
    r"^embedding\.(?:word_embeddings|position_embeddings)\.weight$"
    r"|^output_layer\.(?:weight|bias|_extra_state)$"
    r"|^(?:decoder|encoder)\.final_layernorm\.(?:weight|bias)$"
    rf"|^{re.escape(MASK_BUFFER)}$|^{re.escape(LOOKUP_BUFFER)}$"
    r"|^rotary_pos_emb\.inv_freq$|^mtp\."
)


@dataclass
class FamilyReport:
    """The family of a checkpoint and everything it was decided from (JSON-able)."""

    family: Family | None
    moe: bool
    block: Literal["decoder", "encoder"] | None
    attention: Literal["causal", "bidirectional", "unknown"]
    objective: ObjectiveKind | None  # None: the weights cannot say; the plan must
    mask_id: int | None
    mask_id_source: str | None
    input_vocab_rows: int | None
    output_vocab_rows: int | None
    tied: bool | None
    vocab_padded: bool | None  # a multiple of Megatron's padding (ARM) or the raw vocabulary (MDM)
    expert_layout: Literal["per-expert", "stacked"] | None  # local_experts.{e}.… or experts.experts.… [E, …]
    evidence: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    time_conditioning_keys: list[str] = field(default_factory=list)
    unrecognised_keys: list[str] = field(default_factory=list)
    diffusion_args: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """ "MDM-MoE", "ARM", "UDM (objective unknown)", …"""
        name = self.family or "unknown"
        if self.moe:
            name += "-MoE"
        if self.family is not None and self.objective is None:
            name += " (objective unknown)"
        return name


def _block(keys: Mapping[str, tuple[int, ...]]) -> Literal["decoder", "encoder"] | None:
    prefixes = {m.group(1) for k in keys if (m := _LAYER.match(k))}
    if prefixes == {"encoder"}:
        return "encoder"
    if "decoder" in prefixes:
        return "decoder"
    return None


def _rows(shape: tuple[int, ...] | None) -> int | None:
    return shape[0] if shape is not None and len(shape) == 2 else None


def _expert_layout(keys: Mapping[str, tuple[int, ...]]) -> Literal["per-expert", "stacked"] | None:
    if any(".mlp.experts.local_experts." in k for k in keys):
        return "per-expert"
    if any(".mlp.experts." in k for k in keys):
        return "stacked"
    return None


def unrecognised_keys(shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Model keys that are neither a megatron-core GPT layer's, the embeddings / output / final norm,
    nor a diffusion model's known buffers: what a loader would not know where to put."""
    out = []
    for key in sorted(model_entries(shapes)):
        m = _LAYER.match(key)
        if m:
            if not _KNOWN_LAYER_KEY.match(m.group(3)):
                out.append(key)
        elif not _KNOWN_TOP_KEY.match(key):
            out.append(key)
    return out


def _mask(r: FamilyReport, keys: Mapping[str, tuple[int, ...]], args: Mapping[str, Any]) -> bool:
    """Evidence of a [MASK] token; sets mask_id where the shapes or args determine it."""
    found = False
    inp, out = r.input_vocab_rows, r.output_vocab_rows
    padded_input = int(args.get("padded_input") or 0)
    if inp is not None and out is not None and inp == out + 1 + padded_input:
        r.evidence.append(
            f"input embedding has {inp} rows, the output layer {out}: one extra row, the [MASK] row"
        )
        r.mask_id, r.mask_id_source = out, "the extra input-embedding row"
        found = True
    if MASK_BUFFER in keys:
        r.evidence.append(f"`{MASK_BUFFER}` buffer (the masked-diffusion tokenizer's mask id) is stored")
        found = True
        vocab = args.get("vocab_size")
        if r.mask_id is None and isinstance(vocab, int) and inp is not None and inp > vocab:
            r.mask_id, r.mask_id_source = vocab, "saved vocab_size (the first id past it)"
        if r.mask_id is None:
            r.unknown.append(
                f"mask id: the shapes do not give it; it is the value of the `{MASK_BUFFER}` buffer"
            )
    return found


def detect_family(
    shapes: Mapping[str, tuple[int, ...]], args: Mapping[str, Any] | None = None
) -> FamilyReport:
    """The family of the model whose {tensor key: global shape} and saved args are given."""
    args = dict(args or {})
    keys = model_entries(shapes)
    emb, out = keys.get("embedding.word_embeddings.weight"), keys.get("output_layer.weight")
    r = FamilyReport(
        family=None,
        moe=any(".mlp.router." in k for k in keys),
        block=_block(keys),
        attention="unknown",
        objective=None,
        mask_id=None,
        mask_id_source=None,
        input_vocab_rows=_rows(emb),
        output_vocab_rows=_rows(out),
        tied=(out is None) if emb is not None else None,
        vocab_padded=None,
        expert_layout=_expert_layout(keys),
    )
    vocab = r.output_vocab_rows or r.input_vocab_rows
    if vocab is not None:
        r.vocab_padded = vocab % VOCAB_PAD_MULTIPLE == 0
        if not r.vocab_padded:
            r.evidence.append(
                f"{vocab} vocabulary rows, not a multiple of {VOCAB_PAD_MULTIPLE}: built unpadded"
            )
    if r.block is not None:
        r.evidence.append(f"transformer layers stored under `{r.block}.`")
    if r.moe:
        layout = {
            "per-expert": "per-expert keys (local_experts.{e})",
            "stacked": "experts stacked [E, …]",
        }.get(r.expert_layout or "", "no expert tensors")
        r.evidence.append(f"router weights and {layout}: a mixture-of-experts FFN")
    r.diffusion_args = {k: args[k] for k in DIFFUSION_ARGS if k in args}
    if r.diffusion_args:
        r.evidence.append("saved args of a diffusion entry script: " + ", ".join(sorted(r.diffusion_args)))
    r.time_conditioning_keys = sorted(k for k in keys if _TIME_KEY.search(k))
    if r.time_conditioning_keys:
        r.evidence.append(f"time-conditioning weights ({r.time_conditioning_keys[0]}, …)")
    r.unrecognised_keys = [k for k in unrecognised_keys(shapes) if k not in r.time_conditioning_keys]
    has_mask = _mask(r, keys, args)
    saved = args.get("longctx_objective")
    if saved in ("mdm", "udm"):
        r.evidence.append(f"saved by longctx's trainer with objective {saved!r}")
    _decide(r, has_mask, saved if saved in ("ar", "mdm", "udm") else None)
    return r


def _decide(r: FamilyReport, has_mask: bool, saved: str | None) -> None:
    diffusion = (
        bool(r.diffusion_args)
        or r.block == "encoder"
        or bool(r.time_conditioning_keys)
        or saved in ("mdm", "udm")
    )
    if has_mask:
        r.family, r.objective, r.attention = "MDM", "mdm", "bidirectional"
        return
    if saved == "udm":  # the objective is in the save's args, not guessed from the weights
        r.family, r.objective, r.attention = "UDM", "udm", "bidirectional"
        return
    if diffusion:
        r.family, r.attention = "UDM", "bidirectional"
        r.unknown.append(
            "objective: a diffusion model without a [MASK] row or buffer is a uniform-state one, but its "
            'corruption and bound are not in the weights — pass objective = "udm" (and its bound) in the plan'
        )
        return
    if r.block is None:
        r.unknown.append(
            "family: no transformer layers found (neither `decoder.layers.` nor `encoder.layers.`)"
        )
        return
    r.family, r.objective, r.attention = "ARM", "ar", "causal"
    r.evidence.append("no [MASK] row, no diffusion args, GPT layout: autoregressive")
    r.unknown.append(
        "a diffusion model saved in the GPT layout without a mask row would look the same — if this is one, "
        'pass objective = "mdm" or "udm" in the plan'
    )


def family_findings(family: FamilyReport, where: str, findings: Findings) -> None:
    """The family as an info line; keys no loader knows and time conditioning as warnings."""
    findings.info("family", f"{family.label}: " + "; ".join(family.evidence), where=where)
    for item in family.unknown:
        findings.info("family-unknown", f"unknown — {item}", where=where)
    if family.time_conditioning_keys:
        shown = ", ".join(family.time_conditioning_keys[:4])
        findings.warning(
            "time-conditioning",
            f"{len(family.time_conditioning_keys)} time-conditioning tensors ({shown}, …): longctx's trainer "
            "builds no timestep embedding or adaLN, so it cannot continue this model",
            where=where,
        )
    if family.unrecognised_keys:
        shown = ", ".join(family.unrecognised_keys[:8])
        more = len(family.unrecognised_keys) - 8
        findings.warning(
            "unknown-keys",
            f"{len(family.unrecognised_keys)} model tensors no megatron-core GPT layer stores: {shown}"
            + (f" and {more} more" if more > 0 else ""),
            where=where,
            fix="the loader does not know where these go; check the model class that saved them",
        )


__all__ = [
    "DIFFUSION_ARGS",
    "MASK_BUFFER",
    "FamilyReport",
    "detect_family",
    "family_findings",
    "unrecognised_keys",
]
