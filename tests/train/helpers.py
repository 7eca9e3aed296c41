"""Helpers for trainer tests: specs over the tiny run, running workers, reading saved tensors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from typer.testing import CliRunner

from longctx.arch import ModelArch
from longctx.checkpoint.save_layout import read_tracker
from longctx.cli.main import app
from tests.fixtures.run import ARCH


def spec(run: Path, save: Path, **kw: Any) -> Any:
    from longctx.tokenizer import load_tokenizer, padded_vocab_size
    from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec

    tok = load_tokenizer(run / "tokenizer")
    iters = kw.pop("train_iters", 6)
    base = dict(
        stage="t",
        arch=ModelArch(**ARCH),
        seq_length=128,
        max_position_embeddings=128,
        rotary_base=10000,
        padded_vocab_size=padded_vocab_size(tok.vocab_size, 128, 1),
        tokenizer=TokenizerInfo(
            path=str(run / "tokenizer"),
            md5=tok.md5,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            pad_id=tok.pad_id,
        ),
        data=[(None, str(run / "data" / "corpus_text_document"))],
        split="98,2,0",
        data_cache_path=str(run / "cache"),
        global_batch_size=4,
        micro_batch_size=1,
        train_iters=iters,
        lr=LRSchedule(lr=2e-3, min_lr=2e-4, warmup_iters=1, decay_iters=iters),
        save=str(save),
        save_interval=100,
        threads_per_process=1,
        metrics_file=str(save.parent / "metrics.jsonl"),
    )
    base.update(kw)
    return TrainSpec(**base)


def launch(spec_obj: Any, path: Path, nproc: int = 1) -> subprocess.Popen[bytes]:
    """Start the worker(s) through the same launcher the stage runner uses."""
    spec_obj.dump(path)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from longctx.launch.local import LocalLauncher\n"
        f"sys.exit(LocalLauncher(echo=False).run([sys.executable, '-m', 'longctx.train', '--spec', {str(path)!r}], "
        f"nproc={nproc}, env={{'OMP_NUM_THREADS': '1'}}, log=Path({str(path)!r} + '.log')))\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONUNBUFFERED="1"))


def run(spec_obj: Any, path: Path, nproc: int = 1, timeout: float = 600) -> None:
    p = launch(spec_obj, path, nproc)
    rc = p.wait(timeout=timeout)
    if rc != 0:
        raise AssertionError(f"worker failed ({rc}):\n" + Path(str(path) + ".log").read_text()[-4000:])


def saved_tensors(
    iter_dir: Path, prefixes: tuple[str, ...] = ("decoder", "embedding", "output_layer", "optimizer.state")
) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(iter_dir)).read_metadata()
    out = {
        k: torch.empty(v.size, dtype=v.properties.dtype)
        for k, v in md.state_dict_metadata.items()
        if hasattr(v, "size") and k.startswith(prefixes)
    }
    dcp.load(out, storage_reader=FileSystemReader(str(iter_dir)), no_dist=True)
    return out


def common(iter_dir: Path) -> dict[str, Any]:
    from longctx.checkpoint import inspect_checkpoint

    return inspect_checkpoint(iter_dir).args


def run_first_stage(plan: Path, rp: Any) -> Path:
    """`stage run PLAN --no-eval` (the first stage, to its end); the iteration dir of its last save."""
    res = CliRunner().invoke(app, ["stage", "run", str(plan), "--no-eval"])
    assert res.exit_code == 0, res.output
    s1 = rp.stages[0]
    tracker = read_tracker(s1.save_dir)
    assert tracker is not None and tracker.iteration == s1.train_iters
    return s1.save_dir / tracker.dir_name
