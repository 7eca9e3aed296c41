"""The model architecture, inferred from a checkpoint's tensor shapes (and its saved args when present).

Shapes are what a load must match, so they win over args; a disagreement is reported. GPT keys
(megatron-core, no `model.` prefix): homogeneous layers are stacked under `decoder.layers.` with a
leading num_layers dim; per-layer `decoder.layers.{i}.` keys occur for MoE with moe_layer_freq > 1,
hybrid or heterogeneous models. Shapes are global (TP-agnostic).

    linear_qkv.weight   [L, (nq + 2·ng)·d, H]   grouped per KV head
    linear_proj.weight  [L, H, nq·d]
    q_layernorm.weight  [L, d]                  (QK-norm gives the head dim d directly)
    linear_fc1.weight   [L, 2·F, H] (SwiGLU: gate and up halves) or [L, F, H]
    linear_fc2.weight   [L, H, F]
    mlp.router.weight   [L, E, H]; experts  [L, E, 2·F_moe, H] / [L, E, H, F_moe]
    embedding.word_embeddings.weight [V_padded, H]; output_layer.weight only when untied

Without QK-norm and without args the head dim cannot be read from shapes: pass `head_dim`, else
128 is assumed and the report says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longctx.checkpoint.keys import model_entries
from longctx.errors import CheckpointError
from longctx.report import Findings

if TYPE_CHECKING:
    from longctx.arch import ModelArch

ASSUMED_HEAD_DIM = 128

# GPTModel's block is `decoder.`; the BERT-derived diffusion models store the same layers as `encoder.`
_PER_LAYER = re.compile(r"^(?:decoder|encoder)\.layers\.(\d+)\.(.+)$")
_STACKED = re.compile(r"^(?:decoder|encoder)\.layers\.(?!\d+\.)(.+)$")
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.+)$")

_Shapes = Mapping[str, tuple[int, ...]]  # tensor key → global shape
_Args = Mapping[str, Any]  # saved Megatron args (unpickled argparse.Namespace fields)


@dataclass
class InferredArch:
    """Architecture in Megatron's argument names; `sources[field]` says shape / args / assumed / default."""

    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    group_query_attention: bool | None = None
    kv_channels: int | None = None
    normalization: str | None = None
    norm_epsilon: float | None = None
    swiglu: bool | None = None
    qk_layernorm: bool | None = None
    untie_embeddings_and_output_weights: bool | None = None
    add_bias_linear: bool | None = None
    add_qkv_bias: bool | None = None
    position_embedding_type: str | None = None
    rotary_percent: float | None = None
    init_method_std: float | None = None
    padded_vocab_size: int | None = None
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_router_topk: int | None = None
    moe_router_enable_expert_bias: bool | None = None
    moe_layer_freq: Any = None
    num_moe_layers: int | None = None
    layers_stacked: bool | None = None
    mtp_num_layers: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def head_dim(self) -> int | None:
        return self.kv_channels

    def to_model_arch(self) -> ModelArch:
        """A `longctx.arch.ModelArch` (raises CheckpointError when a required field is unknown)."""
        from longctx.arch import ModelArch  # pydantic (~0.25 s): `ckpt inspect/verify` never need it

        required = ("num_layers", "hidden_size", "num_attention_heads")
        missing = [k for k in required if getattr(self, k) is None]
        ffn = self.ffn_hidden_size or self.moe_ffn_hidden_size
        if ffn is None:
            missing.append("ffn_hidden_size")
        if missing:
            raise CheckpointError(
                f"the checkpoint does not determine {', '.join(missing)}",
                fix="the checkpoint lacks the tensors (and args) these come from; give the architecture explicitly",
            )
        kw: dict[str, Any] = dict(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            ffn_hidden_size=ffn,
            num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups,
            kv_channels=self.kv_channels,
            normalization=self.normalization or "RMSNorm",
            swiglu=bool(self.swiglu),
            qk_layernorm=bool(self.qk_layernorm),
            untie_embeddings_and_output_weights=bool(self.untie_embeddings_and_output_weights),
            add_bias_linear=bool(self.add_bias_linear),
            add_qkv_bias=bool(self.add_qkv_bias),
        )
        if self.norm_epsilon is not None:
            kw["norm_epsilon"] = float(self.norm_epsilon)
        if self.rotary_percent is not None:
            kw["rotary_percent"] = float(self.rotary_percent)
        if self.init_method_std is not None:
            kw["init_method_std"] = float(self.init_method_std)
        if self.num_experts:
            kw.update(
                num_experts=self.num_experts,
                moe_ffn_hidden_size=self.moe_ffn_hidden_size,
                moe_shared_expert_intermediate_size=self.moe_shared_expert_intermediate_size,
            )
            if self.moe_router_topk:
                kw["moe_router_topk"] = self.moe_router_topk
        return ModelArch(**kw)


def _layer_shapes(
    shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, tuple[int, ...]], int | None, bool | None, set[int]]:
    """Per-layer shapes keyed by the name below `decoder.layers.` (first layer that has it), the layer
    count, whether layers are stacked, and the indices of per-layer keys that are MoE layers."""
    per: dict[str, tuple[int, ...]] = {}
    stacked_layers: int | None = None
    indices: set[int] = set()
    moe_layers: set[int] = set()
    stacked_any = False
    for key, shape in shapes.items():
        m = _PER_LAYER.match(key)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            indices.add(i)
            if rest.startswith("mlp.router."):
                moe_layers.add(i)
            per.setdefault(rest, shape)
            continue
        m = _STACKED.match(key)
        if m and shape:
            stacked_any = True
            rest = m.group(1)
            per.setdefault(rest, shape[1:])
            if rest.endswith(".weight") and "layer_norm" not in rest and "layernorm" not in rest:
                stacked_layers = max(stacked_layers or 0, shape[0])
            elif stacked_layers is None:
                stacked_layers = shape[0]
    n = stacked_layers
    if indices:
        n = max(n or 0, max(indices) + 1)
    return per, n, (stacked_any if (stacked_any or indices) else None), moe_layers


def _first(per: Mapping[str, tuple[int, ...]], *names: str) -> tuple[int, ...] | None:
    for n in names:
        if n in per:
            return per[n]
    return None


def _put(a: InferredArch, name: str, value: Any, source: str) -> None:
    setattr(a, name, value)
    a.sources[name] = source


def infer_arch(
    shapes: Mapping[str, tuple[int, ...]],
    args: Mapping[str, Any] | None = None,
    *,
    head_dim: int | None = None,
    findings: Findings | None = None,
) -> InferredArch:
    """Infer the architecture from {tensor key: global shape}; `args` (saved Megatron args) fill what
    shapes cannot tell (heads without QK-norm, norm epsilon, top-k) and are cross-checked."""
    args = dict(args or {})
    f = findings if findings is not None else Findings()
    a = InferredArch()

    model_shapes = model_entries(shapes)
    per, n_layers, stacked, moe_layer_idx = _layer_shapes(model_shapes)
    a.layers_stacked = stacked
    if n_layers is not None:
        _put(a, "num_layers", n_layers, "shape")

    _infer_embeddings(a, model_shapes, args)
    _infer_normalization(a, per, model_shapes)
    _infer_attention(a, per, args, head_dim, f)
    _infer_mlp(a, per)
    _infer_moe(a, per, args, stacked, moe_layer_idx)
    mtp = {int(m.group(1)) for k in model_shapes if (m := re.match(r"^mtp\.layers\.(\d+)\.", k))}
    if mtp:
        _put(a, "mtp_num_layers", max(mtp) + 1, "shape")
    _take_from_args(a, args)
    _cross_check(a, args, f)
    return a


def _infer_embeddings(a: InferredArch, model_shapes: _Shapes, args: _Args) -> None:
    """Vocab rows, hidden size, tied or not, and the position embedding."""
    emb = model_shapes.get("embedding.word_embeddings.weight")
    out = model_shapes.get("output_layer.weight")
    if emb is not None and len(emb) == 2:
        _put(a, "padded_vocab_size", emb[0], "shape")
        _put(a, "hidden_size", emb[1], "shape")
    elif out is not None and len(out) == 2:
        _put(a, "padded_vocab_size", out[0], "shape")
        _put(a, "hidden_size", out[1], "shape")
    if emb is not None or out is not None:
        _put(a, "untie_embeddings_and_output_weights", out is not None, "shape")
    if "embedding.position_embeddings.weight" in model_shapes:
        _put(a, "position_embedding_type", "learned_absolute", "shape")
    elif args.get("position_embedding_type"):
        _put(a, "position_embedding_type", str(args["position_embedding_type"]), "args")
    elif emb is not None:
        _put(a, "position_embedding_type", "rope", "assumed")
        a.notes.append("no position-embedding tensor and no args: rope assumed (rope has no weights)")


def _infer_normalization(a: InferredArch, per: _Shapes, model_shapes: _Shapes) -> None:
    # TE-fused names (linear_qkv.layer_norm_*) or separate input_layernorm
    norm_bias = any(
        k in per for k in ("self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias")
    ) or any(f"{b}.final_layernorm.bias" in model_shapes for b in ("decoder", "encoder"))
    if any(
        k in per for k in ("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight")
    ) or any(f"{b}.final_layernorm.weight" in model_shapes for b in ("decoder", "encoder")):
        _put(a, "normalization", "LayerNorm" if norm_bias else "RMSNorm", "shape")


def _infer_attention(
    a: InferredArch,
    per: _Shapes,
    args: _Args,
    head_dim: int | None,
    f: Findings,
) -> None:
    """QK-norm, biases, and the heads split of linear_qkv / linear_proj."""
    qkv = per.get("self_attention.linear_qkv.weight")
    proj = per.get("self_attention.linear_proj.weight")
    qn = per.get("self_attention.q_layernorm.weight")
    if any(
        k.startswith(
            (
                "self_attention.linear_q_proj",
                "self_attention.linear_q_down_proj",
                "self_attention.linear_kv_down_proj",
            )
        )
        for k in per
    ):
        a.notes.append("multi-latent attention (MLA) weights: heads are not inferred for MLA")
    if qkv is not None or qn is not None:
        _put(a, "qk_layernorm", qn is not None, "shape")
    if qkv is not None:
        _put(a, "add_qkv_bias", "self_attention.linear_qkv.bias" in per, "shape")
    if proj is not None:
        _put(a, "add_bias_linear", "self_attention.linear_proj.bias" in per, "shape")
    if a.hidden_size is None and qkv is not None and len(qkv) == 2:
        _put(a, "hidden_size", qkv[1], "shape")
    if qkv is not None and proj is not None and len(qkv) == 2 and len(proj) == 2:
        _infer_heads(a, qkv[0], proj[1], qn, args, head_dim, f)


def _head_dim(
    a: InferredArch, q_cols: int, qn: tuple[int, ...] | None, args: _Args, head_dim: int | None
) -> tuple[int, str]:
    """The head dim and where it came from: QK-norm shape, args, the caller, or the assumption."""
    if qn is not None and len(qn) == 1:
        return qn[0], "shape"
    if args.get("kv_channels"):
        return int(args["kv_channels"]), "args"
    if args.get("num_attention_heads") and q_cols % int(args["num_attention_heads"]) == 0:
        return q_cols // int(args["num_attention_heads"]), "shape+args"
    if head_dim:
        return int(head_dim), "given"
    a.notes.append(
        f"head dim not determinable (no QK-norm, no args): {ASSUMED_HEAD_DIM} assumed; pass head_dim"
    )
    return ASSUMED_HEAD_DIM, "assumed"


def _infer_heads(
    a: InferredArch,
    rows: int,
    q_cols: int,
    qn: tuple[int, ...] | None,
    args: _Args,
    head_dim: int | None,
    f: Findings,
) -> None:
    """Split linear_qkv rows (nq + 2·ng)·d and linear_proj columns nq·d into heads and query groups."""
    d, d_src = _head_dim(a, q_cols, qn, args, head_dim)
    if d and q_cols % d == 0 and (rows - q_cols) % (2 * d) == 0 and rows > q_cols:
        nq = q_cols // d
        ng = (rows - q_cols) // (2 * d)
        hsrc = "shape" if d_src == "shape" else f"shape ({d_src} head dim)"
        _put(a, "kv_channels", d, d_src)
        _put(a, "num_attention_heads", nq, hsrc)
        _put(a, "num_query_groups", ng, hsrc)
        _put(a, "group_query_attention", ng != nq, hsrc)
        if ng and nq % ng:
            f.warning(
                "arch-groups",
                f"{nq} heads are not a multiple of {ng} query groups: the QKV split is doubtful",
            )
    else:
        f.warning(
            "arch-heads",
            f"cannot split linear_qkv rows {rows} and linear_proj columns {q_cols} with head dim {d}",
            fix="pass the head dim (kv_channels) explicitly",
        )


def _infer_mlp(a: InferredArch, per: _Shapes) -> None:
    fc1 = per.get("mlp.linear_fc1.weight")
    fc2 = per.get("mlp.linear_fc2.weight")
    if fc2 is not None and len(fc2) == 2:
        _put(a, "ffn_hidden_size", fc2[1], "shape")
        if fc1 is not None and len(fc1) == 2:
            _put(a, "swiglu", fc1[0] == 2 * fc2[1], "shape")
    if a.add_bias_linear is None and fc2 is not None:
        _put(a, "add_bias_linear", "mlp.linear_fc2.bias" in per, "shape")


def _expert_shapes(per: _Shapes, n_experts: int) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(expert linear_fc1, linear_fc2) shapes with a leading experts dim, stacked or local experts."""
    e_fc1 = _first(per, "mlp.experts.experts.linear_fc1.weight")
    e_fc2 = _first(per, "mlp.experts.experts.linear_fc2.weight")
    if e_fc2 is None:  # unstacked local experts: mlp.experts.local_experts.{e}.linear_fc2.weight
        locs = [(_LOCAL_EXPERT.match(k), v) for k, v in per.items()]
        fc2s = [v for m, v in locs if m and m.group(2) == "linear_fc2.weight"]
        fc1s = [v for m, v in locs if m and m.group(2) == "linear_fc1.weight"]
        e_fc2 = (n_experts, *fc2s[0]) if fc2s else None
        e_fc1 = (n_experts, *fc1s[0]) if fc1s else None
    return e_fc1, e_fc2


def _infer_moe(
    a: InferredArch,
    per: _Shapes,
    args: _Args,
    stacked: bool | None,
    moe_layer_idx: set[int],
) -> None:
    """Mixture of experts: experts, expert FFN, shared experts, how many layers are MoE."""
    router = per.get("mlp.router.weight")
    if router is None or len(router) != 2:
        _put(a, "num_experts", None, "shape")
        return
    _put(a, "num_experts", router[0], "shape")
    _put(a, "moe_router_enable_expert_bias", "mlp.router.expert_bias" in per, "shape")
    e_fc1, e_fc2 = _expert_shapes(per, router[0])
    if e_fc2 is not None and len(e_fc2) == 3:
        _put(a, "moe_ffn_hidden_size", e_fc2[2], "shape")
        if e_fc1 is not None and len(e_fc1) == 3 and a.swiglu is None:
            _put(a, "swiglu", e_fc1[1] == 2 * e_fc2[2], "shape")
    sh = per.get("mlp.shared_experts.linear_fc2.weight")
    _put(
        a, "moe_shared_expert_intermediate_size", sh[1] if sh is not None and len(sh) == 2 else None, "shape"
    )
    if stacked and not moe_layer_idx:
        _put(a, "num_moe_layers", a.num_layers, "shape")
    elif moe_layer_idx:
        _put(a, "num_moe_layers", len(moe_layer_idx), "shape")
    if a.ffn_hidden_size is None:
        if args.get("ffn_hidden_size"):
            _put(a, "ffn_hidden_size", int(args["ffn_hidden_size"]), "args")
        elif a.moe_ffn_hidden_size is not None:
            _put(a, "ffn_hidden_size", a.moe_ffn_hidden_size, "assumed")


def _take_from_args(a: InferredArch, args: _Args) -> None:
    """What shapes cannot say."""
    for name in ("norm_epsilon", "rotary_percent", "init_method_std", "moe_layer_freq"):
        if args.get(name) is not None:
            _put(a, name, args[name], "args")
    if a.num_experts and args.get("moe_router_topk") is not None:
        _put(a, "moe_router_topk", int(args["moe_router_topk"]), "args")


_CHECKED = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels", "swiglu",
    "qk_layernorm", "untie_embeddings_and_output_weights", "add_bias_linear", "add_qkv_bias", "num_experts",
    "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "padded_vocab_size", "normalization",
)  # fmt: skip


def _cross_check(a: InferredArch, args: _Args, f: Findings) -> None:
    if not args:
        return
    checks = list(_CHECKED)
    if args.get("group_query_attention"):
        checks.append("num_query_groups")
    for name in checks:
        if a.sources.get(name, "").startswith("shape") and name in args and args[name] is not None:
            mine, theirs = getattr(a, name), args[name]
            if name == "ffn_hidden_size" and a.num_experts and a.sources.get(name) != "shape":
                continue
            if _norm(mine) != _norm(theirs):
                f.warning(
                    "arch-args-mismatch",
                    f"saved args say {name}={theirs!r} but the tensor shapes say {mine!r} (shapes are what loads)",
                    where=name,
                    expected=theirs,
                    found=mine,
                )


def _norm(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return str(v)


__all__ = ["ASSUMED_HEAD_DIM", "InferredArch", "infer_arch"]
