"""compare: same architecture across checkpoints; a tokenizer's vocab against the embedding rows."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.checkpoint import compare
from longctx.cli.main import app
from tests.fixtures.checkpoint import CheckpointFixtures
from tests.fixtures.tokenizer import GPT2_LIKE_VOCAB, OELLM_LIKE_VOCAB

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def test_same_architecture_across_tp(megatron_checkpoints: CheckpointFixtures, ermine_archives) -> None:
    r = compare(megatron_checkpoints.save_dir("gqa"), megatron_checkpoints.save_dir("tp2"))
    assert r.ok and r.same_architecture
    assert r.differences == {"padded_vocab_size": [640, 768]}
    assert "padded-vocab-differs" in r.findings.codes("warning")
    assert compare(megatron_checkpoints.save_dir("gqa"), ermine_archives["nested"]).differences == {}


def test_different_architectures(megatron_checkpoints: CheckpointFixtures) -> None:
    r = compare(megatron_checkpoints.save_dir("gqa"), megatron_checkpoints.save_dir("moe"))
    assert not r.ok and not r.same_architecture
    assert r.differences["num_experts"] == [None, 4]
    r = compare(megatron_checkpoints.save_dir("gqa"), megatron_checkpoints.save_dir("tied"))
    assert {
        "num_layers",
        "kv_channels",
        "untie_embeddings_and_output_weights",
        "qk_layernorm",
        "swiglu",
    } <= set(r.differences)
    res = cli("ckpt", "compare", megatron_checkpoints.save_dir("gqa"), megatron_checkpoints.save_dir("tied"))
    assert res.exit_code == 2 and "num_layers: 2 vs 3" in res.output


def test_tokenizer_fits(megatron_checkpoints: CheckpointFixtures, oellm_like_hf_dir: Path) -> None:
    # 512 pieces + <pad> = 513 tokens → 640 rows at /128 × TP 1 (gqa) and 768 at TP 2 (tp2)
    r = compare(megatron_checkpoints.save_dir("gqa"), oellm_like_hf_dir)
    assert r.ok and r.mode == "tokenizer"
    assert (r.vocab.vocab_size, r.vocab.padded_rows, r.vocab.expected_padded_vocab_size) == (
        OELLM_LIKE_VOCAB + 1,
        640,
        640,
    )
    r = compare(megatron_checkpoints.save_dir("tp2"), oellm_like_hf_dir)
    assert r.ok and r.vocab.tensor_model_parallel_size == 2 and r.vocab.matching_tp == [2]
    res = cli("ckpt", "compare", megatron_checkpoints.save_dir("gqa"), oellm_like_hf_dir, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["vocab"]["padding_matches"] is True


def test_wrong_tokenizer(megatron_checkpoints: CheckpointFixtures, gpt2_like_dir: Path) -> None:
    r = compare(megatron_checkpoints.save_dir("gqa"), gpt2_like_dir)
    assert r.vocab.fits and not r.vocab.padding_matches
    (code, msg), *_ = [(f.code, f.message) for f in r.findings.errors]
    assert code == "vocab-padding"
    assert msg == (
        f"640 embedding rows are not Megatron's padding of {GPT2_LIKE_VOCAB} tokens "
        "(multiple of 128 × TP): expected 512 at TP 1"
    )
    res = cli("ckpt", "compare", megatron_checkpoints.save_dir("gqa"), "--vocab-size", 700)
    assert res.exit_code == 2
    assert "the tokenizer has 700 tokens but the embedding has only 640 rows" in " ".join(res.output.split())


def test_padding_of_another_tp_is_a_warning(megatron_checkpoints: CheckpointFixtures) -> None:
    from longctx.checkpoint import inspect_checkpoint
    from longctx.checkpoint.compare import check_vocab
    from longctx.report import Findings

    report = inspect_checkpoint(megatron_checkpoints.save_dir("tp2"))  # 768 rows = 513 padded at TP 2
    report.args = dict(report.args, tensor_model_parallel_size=4)  # as if resharded from TP 4 args
    f = Findings()
    v = check_vocab(report, 513, f)
    assert f.ok and v.matching_tp == [2] and v.expected_padded_vocab_size == 1024
    assert (
        f.warnings[0].message
        == "513 tokens pad to 768 rows only at TP 2; at the saved TP 4 Megatron pads to 1024"
    )
