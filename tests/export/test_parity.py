"""The exported model, loaded with `transformers.AutoModelForCausalLM`, computes what megatron-core
computed: fp32 logits within 1e-4 (relative to the largest logit) on the same tokens, three times the
base's window long, and the same greedy continuation — for GQA + QK-norm + untied (Qwen3) and tied
Llama models, TP 1 and TP 2 saves, four RoPE bases including the stages' extended ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.export import ExportReport, export_hf
from tests.export import hf
from tests.fixtures.export import (
    BASE_SEQ,
    BATCH,
    LENGTH,
    NEW_TOKENS,
    PARITY,
    PROMPT,
    VARIANTS,
    VOCAB,
    ExportModels,
)

WINDOW = {"base": BASE_SEQ, "s1": 128, "s2": 256}


@pytest.fixture(scope="module")
def exported(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, ExportReport]]:
    root = tmp_path_factory.mktemp("exported")
    out = {}
    for name in PARITY:
        spec = VARIANTS[name]
        # the stage comes from the saved args (the local trainer records it)
        report = export_hf(export_models.save_dir(name), export_plan_files[spec["plan"]], out=root / name)
        out[name] = (root / name, report)
    return out


@pytest.mark.parametrize("name", PARITY)
def test_logits_and_greedy_generation_match_megatron(
    name: str, exported: dict[str, tuple[Path, ExportReport]], export_models: ExportModels
) -> None:
    out, report = exported[name]
    spec = VARIANTS[name]
    ref = export_models.reference(name)
    assert LENGTH > BASE_SEQ and ref["logits"].shape == (BATCH, LENGTH, spec["padded"])
    assert report.stage == spec["stage"] and report.stage_source == "saved args"
    model = hf.load(out)
    qk = spec["arch"]["qk_layernorm"]
    assert type(model).__name__ == ("Qwen3ForCausalLM" if qk else "LlamaForCausalLM")
    cfg = model.config
    assert cfg.rope_parameters["rope_theta"] == spec["theta"]
    assert cfg.max_position_embeddings == WINDOW[spec["stage"]]
    assert cfg.vocab_size == VOCAB < spec["padded"]  # the padded rows are cut
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2 and cfg.num_attention_heads == 4
    tied = not spec["arch"]["untie_embeddings_and_output_weights"]
    assert cfg.tie_word_embeddings is tied
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) is tied

    got = hf.logits(model, ref["tokens"])
    rel = hf.relative_difference(got, ref["logits"][..., :VOCAB])
    print(
        f"{name}: max |Δlogit| / max |logit| = {rel:.2e} at {LENGTH} tokens (θ {spec['theta']:,}, TP {spec['tp']})"
    )
    assert rel <= 1e-4
    generated = hf.greedy(model, ref["generated"][:, :PROMPT], NEW_TOKENS)
    assert torch.equal(generated, ref["generated"])


def test_the_comparison_sees_a_wrong_base_and_swapped_norms(
    exported: dict[str, tuple[Path, ExportReport]], export_models: ExportModels
) -> None:
    """The tolerance has teeth: the mistakes an exporter makes move the logits far beyond it."""
    from transformers import AutoModelForCausalLM

    out, _ = exported["qwen3_tp2"]
    ref = export_models.reference("qwen3_tp2")
    want = ref["logits"][..., :VOCAB]
    base_theta = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
    ).eval()
    assert hf.relative_difference(hf.logits(base_theta, ref["tokens"]), want) > 1e-2
    model = hf.load(out)
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_norm.weight.data, attn.k_norm.weight.data = (
            attn.k_norm.weight.data.clone(),
            attn.q_norm.weight.data.clone(),
        )
    assert hf.relative_difference(hf.logits(model, ref["tokens"]), want) > 1e-2


def test_sharded_bf16_export_through_the_cli(
    export_models: ExportModels, export_plan_files: dict[str, Path], exported: dict, tmp_path: Path
) -> None:
    from safetensors import safe_open

    out = tmp_path / "sharded"
    res = CliRunner().invoke(
        app,
        [
            "export",
            "hf",
            str(export_models.save_dir("qwen3_tp1")),
            "--plan",
            str(export_plan_files["qwen3"]),
            "--out",
            str(out),
            "--max-shard-size",
            "50KB",
            "--dtype",
            "bfloat16",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (
        doc["ok"] is True
        and doc["stage"] == "base"
        and doc["rotary_base"] == 10000
        and doc["dtype"] == "bfloat16"
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == doc["shards"] > 3 and not (out / "model.safetensors").exists()
    seen, total = set(), 0
    for shard in shards:
        with safe_open(str(out / shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                t = f.get_tensor(key)
                assert t.dtype == torch.bfloat16 and index["weight_map"][key] == shard
                seen.add(key)
                total += t.numel() * 2
    assert (
        seen == set(index["weight_map"]) and total == index["metadata"]["total_size"] == doc["weight_bytes"]
    )
    assert "lm_head.weight" in seen  # untied
    # the same weights as the single-file fp32 export, rounded to bf16
    ref = export_models.reference("qwen3_tp1")
    got = hf.logits(hf.load(out), ref["tokens"])
    assert hf.relative_difference(got, ref["logits"][..., :VOCAB]) < 5e-2
    with safe_open(str(exported["qwen3_tp1"][0] / "model.safetensors"), "pt") as f:
        single = f.get_tensor("model.layers.1.mlp.down_proj.weight")
    with safe_open(str(out / index["weight_map"]["model.layers.1.mlp.down_proj.weight"]), "pt") as f:
        assert torch.equal(f.get_tensor("model.layers.1.mlp.down_proj.weight"), single.to(torch.bfloat16))
