"""The local trainer's TensorBoard events open with TensorBoard's own reader, under Megatron-LM's tags.

Two real launches of the tiny run (the first stops at an exit interval, the second resumes): one
event file per launch, the scalars against the iteration and against consumed samples, equal to the
metrics file's numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from longctx.train import event_tags as events
from tests.train.helpers import run, spec


def test_local_events_open_with_tensorboards_reader(fresh_run: Path, tmp_path: Path) -> None:
    tb = tmp_path / "stage" / "tensorboard"
    s = spec(fresh_run, tmp_path / "stage" / "ckpt", train_iters=3, exit_interval=2, tensorboard_dir=str(tb))
    run(s, tmp_path / "spec.json")  # stops after iteration 2 (exit interval)
    run(s.model_copy(update={"exit_interval": None}), tmp_path / "spec.json")  # resumes: iteration 3

    files = sorted(tb.glob("events.out.tfevents.*"))
    assert len(files) == 2, files  # one per launch
    records = [json.loads(x) for x in Path(s.metrics_file).read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2, 3]

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    megatron_tags = {
        events.LOSS,
        events.LEARNING_RATE,
        events.GRAD_NORM,
        events.BATCH_SIZE,
        events.ITERATION_TIME,
    }
    assert megatron_tags | {t + events.VS_SAMPLES for t in megatron_tags - {events.ITERATION_TIME}} <= tags
    loss = acc.Scalars(events.LOSS)
    assert [e.step for e in loss] == [1, 2, 3]
    assert all(abs(e.value - r["loss"]) < 1e-5 for r, e in zip(records, loss, strict=True))
    by_samples = acc.Scalars(events.LOSS + events.VS_SAMPLES)
    assert [e.step for e in by_samples] == [4, 8, 12]  # global batch 4: consumed samples
    lr = acc.Scalars(events.LEARNING_RATE)
    assert all(abs(e.value - r["lr"]) < 1e-9 for r, e in zip(records, lr, strict=True))
    tps = acc.Scalars(events.TOKENS_PER_SECOND)
    assert all(e.value > 0 for e in tps) and len(tps) == 3
