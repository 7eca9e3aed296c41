"""A megatron-core ≥ 0.19 save (no common.pt: the common state is the DCP object `common_state/shard_0_1`),
its layout checked against 0.19's dist_checkpointing source, read by every reader of common state."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.metadata import COMMON_STATE_KEY, read_common_state, read_dcp_index
from longctx.checkpoint.tree import DirTree
from longctx.checkpoint.verify import verify_checkpoint
from longctx.megatron_versions import facts
from longctx.stage.run import checkpoint_identity
from longctx.stage.saved_schedule import checkpoint_schedule
from tests.fixtures.checkpoint import CheckpointFixtures

SOURCE_019 = Path(__file__).resolve().parents[3] / "shared" / "megatron-lm-0.19" / "megatron" / "core"


def test_layout_matches_0_19_source(megatron_checkpoints: CheckpointFixtures) -> None:
    it_dir = megatron_checkpoints.iter_dir("era019")
    names = sorted(p.name for p in it_dir.iterdir())
    assert "common.pt" not in names
    assert [n for n in names if n.endswith(".distcp")] == [
        n for n in names if re.fullmatch(r"__\d+_0\.distcp", n)
    ]
    assert json.loads((it_dir / "metadata.json").read_text()) == {
        "sharded_backend": "torch_dist",
        "sharded_backend_version": 1,
    }
    assert COMMON_STATE_KEY in read_dcp_index(DirTree(it_dir), "").bytes_locations
    assert facts("0.19").common_state == "dcp" and facts("0.18").common_state == "common.pt"
    if not SOURCE_019.is_dir():
        pytest.skip(f"0.19's megatron/core is not beside this clone ({SOURCE_019})")
    dc = SOURCE_019 / "dist_checkpointing"
    serialization = (dc / "serialization.py").read_text(encoding="utf-8")
    # what the fixture reproduces: the key, shape/offset (→ shard_0_1), the replica id, one writer thread,
    # the two-field CheckpointingConfig
    assert (
        'key="common_state",' in serialization
        and "global_shape=(1,),\n        global_offset=(0,)," in serialization
    )
    assert "replica_id=torch.distributed.get_rank()" in serialization
    assert re.search(r"thread_count: int = 1,", (dc / "strategies" / "torch.py").read_text(encoding="utf-8"))
    core = (dc / "core.py").read_text(encoding="utf-8")
    fields = re.search(r"class CheckpointingConfig:.*?\n\n\ndef ", core, re.S)
    assert fields and re.findall(r"^    (\w+): ", fields.group(0), re.M) == [
        "sharded_backend",
        "sharded_backend_version",
    ]


def test_common_state_as_torch_dcp_loads_it(megatron_checkpoints: CheckpointFixtures) -> None:
    """The reader's bytes (offset into the shard file) give what torch DCP's own load gives, which is how
    0.19's load_common_state_dict reads it."""
    it_dir = megatron_checkpoints.iter_dir("era019")
    ours = read_common_state(DirTree(it_dir), "", None)
    assert ours.era == "common_state" and ours.state is not None
    buf = {COMMON_STATE_KEY: io.BytesIO()}
    dcp.load(buf, storage_reader=FileSystemReader(str(it_dir)), no_dist=True)
    loaded = buf[COMMON_STATE_KEY]
    if isinstance(loaded, io.BytesIO):
        loaded.seek(0)
        loaded = torch.load(loaded, weights_only=False)
    theirs = loaded[0]
    assert set(ours.state) == set(theirs)
    assert ours.state["iteration"] == theirs["iteration"] == 6
    assert ours.state["opt_param_scheduler"] == theirs["opt_param_scheduler"]

    # longctx unpickles Megatron's enums as stand-ins (no megatron import): compare their values
    def plain(ns: object) -> dict[str, object]:
        return {k: getattr(v, "value", v) for k, v in vars(ns).items()}

    assert plain(ours.state["args"]) == plain(theirs["args"])


def test_every_reader(megatron_checkpoints: CheckpointFixtures) -> None:
    save = megatron_checkpoints.save_dir("era019")
    r = inspect_checkpoint(save)
    assert (r.iteration, r.megatron_core_era, r.common_state_format) == (6, ">=0.19", "common_state")
    assert r.args["num_layers"] == 2 and r.args["global_batch_size"] == 8
    v = verify_checkpoint(save)
    assert v.ok, v.findings
    assert v.iteration == 6
    assert not [f for f in v.findings if "common" in f.code]
    # the saved-schedule check of `stage run` (read with no index at hand)
    assert checkpoint_schedule(save) == {
        "lr": 3e-4,
        "min_lr": 3e-5,
        "lr_warmup_iters": 6,
        "lr_decay_iters": 60,
        "lr_decay_style": "cosine",
        "weight_decay": 0.1,
        "global_batch_size": 8,
    }
    # the ledger binding names the save by its tracker's iteration and index
    ident = checkpoint_identity(save)
    assert ident.startswith(f"{save}@iter_0000006:") and not ident.endswith("no-metadata")


def test_export_reads_the_weights(megatron_checkpoints: CheckpointFixtures) -> None:
    """The exporter's path: the architecture from inspect, the Hugging Face tensor plan over the save's
    index, every read served from the shards (the common-state object is no model tensor)."""
    from longctx.export.mapping import build_plan, model_keys
    from longctx.export.reader import DcpReader

    it_dir = megatron_checkpoints.iter_dir("era019")
    report = inspect_checkpoint(it_dir)
    arch = report.to_model_arch()
    reader = DcpReader(it_dir)
    assert COMMON_STATE_KEY not in model_keys(reader.keys())
    plan = build_plan(reader, arch, "qwen3", report.padded_vocab_size or 256, where=str(it_dir))
    assert plan.consumed == model_keys(reader.keys())
    for step in plan.steps:
        region = reader.read(step.read.key, step.read.offsets, step.read.sizes)
        assert tuple(region.shape) == step.read.sizes and torch.isfinite(region).all()
