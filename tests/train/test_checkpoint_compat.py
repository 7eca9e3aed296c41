"""A local-backend checkpoint is a real Megatron-LM torch_dist checkpoint: it loads with megatron-core's
dist_checkpointing into a fresh GPTModel at TP = 1 and TP = 2, and `longctx ckpt` reads it right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.run import ARCH, BASE_ITERS, BASE_SEQ

HERE = Path(__file__).parent


def _load_loss(ckpt: Path, out: Path, nproc: int) -> float:
    code = (
        "import sys\nfrom pathlib import Path\nfrom longctx.launch.local import LocalLauncher\n"
        f"sys.exit(LocalLauncher(echo=False).run([sys.executable, {str(HERE / 'tp_load.py')!r}, {str(ckpt)!r}, "
        f"{str(out)!r}], nproc={nproc}, env={{'OMP_NUM_THREADS': '1', 'PYTHONPATH': {str(HERE.parents[1])!r}}}, "
        f"log=Path({str(out)!r} + '.log')))\n"
    )
    rc = subprocess.run([sys.executable, "-c", code], timeout=600).returncode
    assert rc == 0, Path(str(out) + ".log").read_text()[-3000:]
    return json.loads(out.read_text())["loss"]


def test_loads_at_tp1_and_tp2_with_the_same_loss(tiny_run: Path, tmp_path: Path) -> None:
    ckpt = tiny_run / "base" / "checkpoints"
    l1 = _load_loss(ckpt, tmp_path / "tp1.json", 1)
    l2 = _load_loss(ckpt, tmp_path / "tp2.json", 2)
    assert l1 == pytest.approx(l2, rel=1e-5)
    assert 3.0 < l1 < 7.0  # a trained model, not a random one with another seed (ln 640 ≈ 6.46 at init)


def test_inspect_and_verify_report_it(tiny_run: Path) -> None:
    ckpt = tiny_run / "base" / "checkpoints"
    r = CliRunner().invoke(app, ["ckpt", "inspect", str(ckpt), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["iteration"] == BASE_ITERS
    arch = rep["arch"]
    for k in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
    ):
        assert arch[k] == ARCH[k], k
    assert arch["qk_layernorm"] is True and arch["untie_embeddings_and_output_weights"] is True
    assert rep["saved_args"]["rotary_base"] == 10000 and rep["saved_args"]["seq_length"] == BASE_SEQ
    assert rep["padded_vocab_size"] == 640
    r = CliRunner().invoke(app, ["ckpt", "check", str(ckpt)])
    assert r.exit_code == 0, r.output
