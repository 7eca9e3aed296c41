"""YaRN as Megatron-LM ≥ 0.19 trains it for GPT, exported as `rope_parameters` with rope_type "yarn": the
frequencies and attention factor transformers computes from the written config equal megatron-core's
YarnRotaryEmbedding at the exported length, and the argv flags exist in 0.19's parser (and are refused
on 0.16, whose GPT model would ignore them). A YaRN stage's checkpoint exports as YaRN and computes what
megatron-core's YaRN model computed; a checkpoint whose saved RoPE is not its stage's is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import ExportError, RopeError
from longctx.export.config import rope_parameters
from longctx.mcore.cpu import apply_cpu_compat
from longctx.rope.megatron import megatron_core_rope_kwargs, megatron_rope_flags
from longctx.rope.scaling import RopeScaling
from longctx.stage.megatron_source import parser_flags
from tests.export import hf
from tests.fixtures.export import BASE_THETA, NEW_TOKENS, PROMPT, VOCAB, YARN_SEQ, ExportModels

CHECKOUT_019 = Path(__file__).resolve().parents[3] / "shared" / "megatron-lm-0.19"
HEAD_DIM = 128
CASES = [(1_000_000, 4.0, 32768), (10_000, 4.0, 4096), (500_000, 8.0, 8192)]  # base, s, original length


def _hf(tmp_path: Path, rope: dict, length: int) -> tuple[torch.Tensor, float]:
    """inv_freq and attention factor as transformers computes them from a written config.json."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = {
        "model_type": "qwen3",
        "hidden_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": length,
        "rope_parameters": rope,
        "rope_theta": rope["rope_theta"],
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    read = AutoConfig.from_pretrained(str(tmp_path))
    assert read.rope_parameters["rope_type"] == "yarn"
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](read, "cpu")
    return inv_freq, float(factor)


@pytest.mark.parametrize(("base", "s", "original"), CASES)
def test_transformers_yarn_equals_megatron_at_the_exported_length(
    tmp_path: Path, base: int, s: float, original: int
) -> None:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    apply_cpu_compat()  # megatron-core's get_emb moves its frequencies to CUDA otherwise
    length = int(s * original)
    scaling = RopeScaling("yarn", s, original)
    inv_freq, attention_factor = _hf(tmp_path, rope_parameters(float(base), scaling, length), length)
    # the local backend's megatron-core settings for the same choice (what the 0.19 flags set)
    kw = megatron_core_rope_kwargs(scaling, "0.19.0", base=base)
    assert kw["position_embedding_type"] == "yarn"
    c = kw["config"]
    meg = YarnRotaryEmbedding(
        HEAD_DIM,
        rotary_base=float(base),
        use_cpu_initialization=True,
        scaling_factor=c["yarn_rotary_scaling_factor"],
        original_max_position_embeddings=c["yarn_original_max_position_embeddings"],
        beta_fast=c["yarn_beta_fast"],
        beta_slow=c["yarn_beta_slow"],
        mscale=c["yarn_mscale"],
        mscale_all_dim=c["yarn_mscale_all_dim"],
        correction_range_round_to_int=c["yarn_correction_range_round_to_int"],
    )
    emb, mscale = meg.get_emb(length)
    last = emb[length - 1, 0, 0, : HEAD_DIM // 2].double()
    torch.testing.assert_close(last, (length - 1) * inv_freq.double(), rtol=2e-6, atol=0)
    assert mscale == pytest.approx(attention_factor, rel=1e-12)


def test_reference_vector_and_refusals() -> None:
    """rope.md §4: YaRN (1e6, s 4, L0 32768) inv_freq[33] = 4.503236e-04; mscale(4) = 1.138629."""
    rope = rope_parameters(1e6, RopeScaling("yarn", 4.0, 32768), 131072)
    assert rope["attention_factor"] == pytest.approx(1.138629, abs=1e-6)
    with pytest.raises(ExportError, match=r"not the exported length 65536"):
        rope_parameters(1e6, RopeScaling("yarn", 4.0, 32768), 65536)
    with pytest.raises(ExportError, match=r"'llama3' is not exported"):
        rope_parameters(5e5, RopeScaling("llama3", 8.0, 8192), 131072)
    assert rope_parameters(1e6, None, 131072) == {"rope_type": "default", "rope_theta": 1e6}


def test_yarn_flags_exist_in_0_19_and_are_refused_on_0_16() -> None:
    scaling = RopeScaling("yarn", 4.0, 32768)
    words = megatron_rope_flags(scaling, "0.19.0", base=1_000_000)
    assert words[:2] == ["--position-embedding-type", "yarn"]
    with pytest.raises(RopeError, match=r"yarn: .* exist for GPT only from megatron-core 0\.19\.0"):
        megatron_rope_flags(scaling, "0.16.1", base=1_000_000)
    if not (CHECKOUT_019 / "megatron" / "training" / "arguments.py").is_file():
        pytest.skip(f"0.19's checkout is not beside this clone ({CHECKOUT_019})")
    known = parser_flags(CHECKOUT_019)
    flags = [(w, i) for i, w in enumerate(words) if w.startswith("--")]
    for w, i in flags:
        assert w in known, w
        assert known[w].takes_value == (i + 1 < len(words) and not words[i + 1].startswith("--")), w


def _export(
    models: ExportModels, name: str, plan: Path, out: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    res = CliRunner().invoke(
        app,
        [
            "export",
            "hf",
            str(models.save_dir(name)),
            "--plan",
            str(plan),
            "--out",
            str(out),
            "--json",
            *extra,
        ],
    )
    return res.exit_code, json.loads(res.stdout)


def test_a_yarn_stage_exports_yarn_and_computes_what_megatron_computed(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "yarn"
    code, doc = _export(export_models, "qwen3_yarn", export_plan_files["qwen3_yarn"], out)
    assert code == 0, doc
    assert doc["stage"] == "y" and doc["stage_source"] == "saved args"
    want = {
        "rope_type": "yarn",
        "rope_theta": float(BASE_THETA),
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": pytest.approx(0.1 * np.log(4.0) + 1.0),
        "truncate": True,
    }
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"] == want == doc["rope_parameters"]
    assert cfg["max_position_embeddings"] == YARN_SEQ
    provenance = json.loads((out / "longctx_export.json").read_text())
    assert provenance["stage"]["rope_scaling"]["type"] == "yarn"

    ref = export_models.reference("qwen3_yarn")
    model = hf.load(out)
    rel = hf.relative_difference(hf.logits(model, ref["tokens"]), ref["logits"][..., :VOCAB])
    print(f"qwen3_yarn: max |Δlogit| / max |logit| = {rel:.2e}")
    assert rel <= 1e-4
    assert torch.equal(hf.greedy(model, ref["generated"][:, :PROMPT], NEW_TOKENS), ref["generated"])
    # the comparison has teeth: the same weights under plain RoPE compute something else
    plain = AutoModelForCausalLM.from_pretrained(
        str(out),
        dtype=torch.float32,
        rope_parameters={"rope_type": "default", "rope_theta": float(BASE_THETA)},
    ).eval()
    assert hf.relative_difference(hf.logits(plain, ref["tokens"]), ref["logits"][..., :VOCAB]) > 1e-2


def test_saved_rope_other_than_the_stages_is_refused(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    code, doc = _export(
        export_models, "qwen3_yarn", export_plan_files["qwen3"], tmp_path / "a", "--stage", "base"
    )
    assert code == 2 and not (tmp_path / "a").exists()
    err = doc["error"]
    assert "position_embedding_type 'yarn', but the plan's base model plans plain RoPE" in err["what"]
    assert err["where"].endswith("iter_0000003") and "--stage" in err["fix"]
    code, doc = _export(
        export_models, "qwen3_tp1", export_plan_files["qwen3_yarn"], tmp_path / "b", "--stage", "y"
    )
    assert code == 2 and "position_embedding_type 'rope', but stage y plans YaRN" in doc["error"]["what"]
    other = tmp_path / "beta16.toml"
    other.write_text(
        export_plan_files["qwen3_yarn"]
        .read_text()
        .replace('method = "yarn" }', 'method = "yarn", params = { beta_fast = 16.0 } }')
    )
    code, doc = _export(export_models, "qwen3_yarn", other, tmp_path / "c")
    assert (
        code == 2
        and "YaRN settings are not stage y's: yarn_beta_fast 32.0 (stage: 16)" in doc["error"]["what"]
    )
