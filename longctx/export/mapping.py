"""Megatron (megatron-core GPTModel, torch_dist) tensor names and layouts → Hugging Face Qwen3 / Llama.

Global tensors of a save (TP-agnostic: DCP assembles the TP slices), per layer i:

    embedding.word_embeddings.weight        [Vp, H]   → model.embed_tokens.weight [V, H] (padded rows cut)
    …linear_qkv.layer_norm_weight | input_layernorm.weight   → model.layers.i.input_layernorm.weight
    …self_attention.linear_qkv.weight       [ng·(q+2)·d, H], per query group: its q heads, then k, then v
                                            → self_attn.{q_proj [nq·d, H], k_proj [ng·d, H], v_proj [ng·d, H]}
    …self_attention.q_layernorm / k_layernorm.weight  [d]   → self_attn.q_norm / k_norm.weight
    …self_attention.linear_proj.weight      [H, nq·d] → self_attn.o_proj.weight
    …mlp.linear_fc1.layer_norm_weight | pre_mlp_layernorm.weight → post_attention_layernorm.weight
    …mlp.linear_fc1.weight                  [2F, H] = [gate; up] → mlp.gate_proj, mlp.up_proj [F, H]
    …mlp.linear_fc2.weight                  [H, F]    → mlp.down_proj.weight
    decoder.final_layernorm.weight          [H]       → model.norm.weight
    output_layer.weight (untied only)       [Vp, H]   → lm_head.weight [V, H]

Both spellings of the two pre-norms occur: megatron-core's local and TE specs save TE's fused names,
saves without that key map the module names. Layers are stacked (`decoder.layers.<name>` with a
leading layer dim) or per layer (`decoder.layers.<i>.<name>`). Every model tensor of the save must be
consumed by the mapping: one the exporter does not know is refused, never dropped.

The plan is a list of steps, each one read (one layer of one tensor, or the rows of one saved chunk of
the embedding) and the Hugging Face tensors or pieces it yields, in file order: the writer streams
them, so memory stays at one step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import torch

from longctx.arch import ModelArch
from longctx.checkpoint.keys import is_model_key
from longctx.errors import ExportError
from longctx.export.family import Family

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
INPUT_NORM = ("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight")
PRE_MLP_NORM = ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight")


class TensorSource(Protocol):
    """What the plan needs to know of a save: its tensor keys, global shapes and chunk rows."""

    def keys(self) -> Iterable[str]: ...

    def shape(self, key: str) -> tuple[int, ...]: ...

    def row_blocks(self, key: str) -> list[tuple[int, int]]: ...


@dataclasses.dataclass(frozen=True)
class HfTensor:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Read:
    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


Split = Callable[[torch.Tensor], list[tuple[str, torch.Tensor]]]


@dataclasses.dataclass(frozen=True)
class Step:
    read: Read
    split: Split  # the region read → (Hugging Face name, tensor or next rows of it), in file order


@dataclasses.dataclass
class TensorPlan:
    tensors: list[HfTensor]  # file order
    steps: list[Step]
    consumed: set[str]
    tied: bool

    def largest_read(self, itemsize: int) -> int:
        return max(s.read.numel for s in self.steps) * itemsize


@dataclasses.dataclass(frozen=True)
class _Dims:
    layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    head_dim: int

    @classmethod
    def of(cls, arch: ModelArch) -> _Dims:
        return cls(
            arch.num_layers,
            arch.hidden_size,
            arch.ffn_hidden_size,
            arch.num_attention_heads,
            arch.query_groups,
            arch.head_dim,
        )


class _Builder:
    def __init__(self, src: TensorSource, where: str) -> None:
        self.src = src
        self.where = where
        self.keys = set(src.keys())
        self.tensors: list[HfTensor] = []
        self.steps: list[Step] = []
        self.consumed: set[str] = set()

    def _missing(self, what: str) -> ExportError:
        return ExportError(
            f"the checkpoint has no {what}",
            where=self.where,
            fix="the save is incomplete or not a megatron-core GPTModel; check it with `longctx ckpt check`",
        )

    def _check(self, key: str, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
        if shape != want:
            raise ExportError(
                f"{key} has shape {list(shape)}, but the architecture needs {list(want)}",
                where=self.where,
                fix="the checkpoint and the architecture inferred from it disagree; inspect it with "
                "`longctx ckpt inspect`",
            )

    def layer(self, names: Sequence[str], i: int, want: tuple[int, ...]) -> Read:
        """The region of layer i of the first of `names` present, stacked or per layer."""
        for name in names:
            stacked, single = f"decoder.layers.{name}", f"decoder.layers.{i}.{name}"
            if stacked in self.keys:
                shape = self.src.shape(stacked)
                self._check(stacked, shape[1:], want)
                if not i < shape[0]:
                    raise self._missing(f"layer {i} in {stacked} (it stacks {shape[0]} layers)")
                self.consumed.add(stacked)
                return Read(stacked, (i,) + (0,) * len(want), (1, *want))
            if single in self.keys:
                self._check(single, self.src.shape(single), want)
                self.consumed.add(single)
                return Read(single, (0,) * len(want), want)
        raise self._missing(f"tensor {' or '.join(f'decoder.layers.[{i}.]{n}' for n in names)}")

    def whole(self, key: str, want: tuple[int, ...]) -> Read:
        if key not in self.keys:
            raise self._missing(f"tensor {key}")
        self._check(key, self.src.shape(key), want)
        self.consumed.add(key)
        return Read(key, (0,) * len(want), want)

    def add(self, read: Read, outputs: Sequence[HfTensor], split: Split) -> None:
        self.tensors.extend(outputs)
        self.steps.append(Step(read, split))

    def one(self, read: Read, name: str, shape: tuple[int, ...]) -> None:
        self.add(read, [HfTensor(name, shape)], lambda t: [(name, t.reshape(shape))])

    def vocab_rows(self, key: str, name: str, vocab: int, hidden: int) -> None:
        """Rows [0, vocab) of a [Vp, H] tensor, read one saved chunk of rows at a time."""
        if key not in self.keys:
            raise self._missing(f"tensor {key}")
        shape = self.src.shape(key)
        if len(shape) != 2 or shape[1] != hidden:
            self._check(key, shape, (shape[0] if shape else 0, hidden))
        if shape[0] < vocab:
            raise ExportError(
                f"{key} has {shape[0]} rows, fewer than the tokenizer's {vocab} tokens",
                where=self.where,
                fix="export with the plan whose tokenizer trained this checkpoint",
            )
        self.consumed.add(key)
        self.tensors.append(HfTensor(name, (vocab, hidden)))
        for start, end in self.src.row_blocks(key):
            if start >= vocab:
                break
            stop = min(end, vocab)
            self.steps.append(Step(Read(key, (start, 0), (stop - start, hidden)), lambda t, n=name: [(n, t)]))


def _qkv_split(prefix: str, d: _Dims) -> Split:
    per_group = d.heads // d.groups

    def split(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        w = t.reshape(d.groups, per_group + 2, d.head_dim, d.hidden)
        return [
            (f"{prefix}.q_proj.weight", w[:, :per_group].reshape(d.heads * d.head_dim, d.hidden)),
            (f"{prefix}.k_proj.weight", w[:, per_group].reshape(d.groups * d.head_dim, d.hidden)),
            (f"{prefix}.v_proj.weight", w[:, per_group + 1].reshape(d.groups * d.head_dim, d.hidden)),
        ]

    return split


def _fc1_split(prefix: str, d: _Dims) -> Split:
    def split(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        w = t.reshape(2, d.ffn, d.hidden)
        return [(f"{prefix}.gate_proj.weight", w[0]), (f"{prefix}.up_proj.weight", w[1])]

    return split


def _layer(b: _Builder, i: int, d: _Dims, family: Family) -> None:
    p = f"model.layers.{i}"
    attn, mlp = f"{p}.self_attn", f"{p}.mlp"
    q_rows, kv_rows = d.heads * d.head_dim, d.groups * d.head_dim
    b.one(b.layer(INPUT_NORM, i, (d.hidden,)), f"{p}.input_layernorm.weight", (d.hidden,))
    qkv = b.layer(("self_attention.linear_qkv.weight",), i, (q_rows + 2 * kv_rows, d.hidden))
    b.add(
        qkv,
        [
            HfTensor(f"{attn}.q_proj.weight", (q_rows, d.hidden)),
            HfTensor(f"{attn}.k_proj.weight", (kv_rows, d.hidden)),
            HfTensor(f"{attn}.v_proj.weight", (kv_rows, d.hidden)),
        ],
        _qkv_split(attn, d),
    )
    if family == "qwen3":
        b.one(
            b.layer(("self_attention.q_layernorm.weight",), i, (d.head_dim,)),
            f"{attn}.q_norm.weight",
            (d.head_dim,),
        )
        b.one(
            b.layer(("self_attention.k_layernorm.weight",), i, (d.head_dim,)),
            f"{attn}.k_norm.weight",
            (d.head_dim,),
        )
    b.one(
        b.layer(("self_attention.linear_proj.weight",), i, (d.hidden, q_rows)),
        f"{attn}.o_proj.weight",
        (d.hidden, q_rows),
    )
    b.one(b.layer(PRE_MLP_NORM, i, (d.hidden,)), f"{p}.post_attention_layernorm.weight", (d.hidden,))
    fc1 = b.layer(("mlp.linear_fc1.weight",), i, (2 * d.ffn, d.hidden))
    b.add(
        fc1,
        [
            HfTensor(f"{mlp}.gate_proj.weight", (d.ffn, d.hidden)),
            HfTensor(f"{mlp}.up_proj.weight", (d.ffn, d.hidden)),
        ],
        _fc1_split(mlp, d),
    )
    b.one(
        b.layer(("mlp.linear_fc2.weight",), i, (d.hidden, d.ffn)),
        f"{mlp}.down_proj.weight",
        (d.hidden, d.ffn),
    )


def model_keys(keys: Iterable[str]) -> set[str]:
    """The tensors of a save that belong to the model (not optimizer, RNG or common state)."""
    return {k for k in keys if is_model_key(k) and "_extra_state" not in k}


def build_plan(
    src: TensorSource, arch: ModelArch, family: Family, vocab_size: int, *, where: str
) -> TensorPlan:
    """Every Hugging Face tensor of the export, and the reads that produce it."""
    d = _Dims.of(arch)
    b = _Builder(src, where)
    b.vocab_rows(EMBEDDING, "model.embed_tokens.weight", vocab_size, d.hidden)
    for i in range(d.layers):
        _layer(b, i, d, family)
    b.one(b.whole(FINAL_NORM, (d.hidden,)), "model.norm.weight", (d.hidden,))
    tied = not arch.untie_embeddings_and_output_weights
    if not tied:
        b.vocab_rows(OUTPUT, "lm_head.weight", vocab_size, d.hidden)
    left = sorted(model_keys(b.keys) - b.consumed)
    if left:
        shown = ", ".join(left[:6]) + (f" (+{len(left) - 6} more)" if len(left) > 6 else "")
        raise ExportError(
            f"the checkpoint has model tensors the {family} mapping does not know: {shown}",
            where=where,
            fix="these weights would be dropped and the exported model would compute something else; only "
            "Qwen3-style and Llama-style GPT models export",
        )
    return TensorPlan(b.tensors, b.steps, b.consumed, tied)


__all__ = ["HfTensor", "Read", "Step", "TensorPlan", "TensorSource", "build_plan", "model_keys"]
