"""verify_checkpoint: whole checkpoints pass; each bad input fails with its exact message and exit 2."""

from __future__ import annotations

import json
import os
import pickle
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint import verify_checkpoint
from longctx.cli.main import app
from tests.fixtures.checkpoint import VARIANTS, CheckpointFixtures, copy_checkpoint

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _errors(report) -> list[tuple[str, str]]:
    return [(f.code, f.message) for f in report.findings.errors]


def _cli_fails_with(path: Path, text: str, *extra: object) -> None:
    res = cli("ckpt", "check", path, *extra)
    assert res.exit_code == 2, res.output
    assert text in " ".join(res.output.split())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_whole_checkpoints_pass(megatron_checkpoints: CheckpointFixtures, name: str) -> None:
    report = verify_checkpoint(megatron_checkpoints.save_dir(name))
    assert report.ok, report.findings
    assert report.shard_files == len(list(megatron_checkpoints.iter_dir(name).glob("*.distcp")))


def test_archives_and_flat_snapshot_pass(ermine_archives: dict[str, Path], flat_snapshot: Path) -> None:
    for path in (*ermine_archives.values(), flat_snapshot):
        report = verify_checkpoint(path)
        assert report.ok, (path, report.findings)
    res = cli("ckpt", "check", ermine_archives["nested"])
    assert res.exit_code == 0, res.output


def test_missing_shard(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa_opt"), tmp_path / "iter_0000010")
    (ck / "__1_0.distcp").unlink()
    report = verify_checkpoint(ck)
    ((code, msg),) = _errors(report)
    assert code == "missing-shard"
    assert msg.startswith("shard __1_0.distcp is missing (") and msg.endswith("stored items reference it)")
    _cli_fails_with(ck, "shard __1_0.distcp is missing")


def test_truncated_shard(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "iter_0000005")
    shard = ck / "__0_1.distcp"
    need = shard.stat().st_size
    os.truncate(shard, 1000)
    report = verify_checkpoint(ck)
    assert _errors(report) == [
        ("truncated-shard", f"shard __0_1.distcp is truncated: 1000 bytes, .metadata needs at least {need}")
    ]
    _cli_fails_with(ck, f"shard __0_1.distcp is truncated: 1000 bytes, .metadata needs at least {need}")


def test_missing_metadata_json(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "iter_0000005")
    (ck / "metadata.json").unlink()
    report = verify_checkpoint(ck)
    assert _errors(report) == [
        (
            "incomplete",
            "incomplete checkpoint: no metadata.json (rank 0 writes it last: the save did not finish)",
        )
    ]
    _cli_fails_with(ck, "no metadata.json (rank 0 writes it last: the save did not finish)")


def test_tracker_to_missing_iteration(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    (save / "latest_checkpointed_iteration.txt").write_text("7\n")
    report = verify_checkpoint(save)
    assert _errors(report) == [("tracker", "the tracker names iter_0000007, which does not exist")]
    assert "the newest complete iteration is 5" in report.findings.errors[0].fix
    _cli_fails_with(save, "the tracker names iter_0000007, which does not exist")


def test_tracker_to_incomplete_iteration(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    partial = copy_checkpoint(save / "iter_0000005", save / "iter_0000008")
    (partial / "metadata.json").unlink()
    (save / "latest_checkpointed_iteration.txt").write_text("8\n")
    report = verify_checkpoint(save)
    msg = (
        "the tracker names iter_0000008, which is incomplete: no metadata.json "
        "(rank 0 writes it last: the save did not finish)"
    )
    assert _errors(report) == [("tracker", msg)]
    _cli_fails_with(save, "the tracker names iter_0000008, which is incomplete")


def test_tracker_with_garbage(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    (save / "latest_checkpointed_iteration.txt").write_text("iter_5\n")
    report = verify_checkpoint(save)
    assert _errors(report) == [
        ("tracker", "the tracker holds 'iter_5', not an iteration number or 'release'")
    ]
    _cli_fails_with(save, "the tracker holds 'iter_5', not an iteration number or 'release'")


def test_tracker_lags_behind_a_complete_save(
    megatron_checkpoints: CheckpointFixtures, tmp_path: Path
) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    copy_checkpoint(save / "iter_0000005", save / "iter_0000009")
    report = verify_checkpoint(save)
    assert report.ok and "tracker-lags" in report.findings.codes("info")


def test_corrupt_dot_metadata(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "iter_0000005")
    data = (ck / ".metadata").read_bytes()
    (ck / ".metadata").write_bytes(data[: len(data) // 2])
    report = verify_checkpoint(ck)
    ((code, msg),) = _errors(report)
    assert code == "dcp-metadata"
    assert (
        msg
        == "cannot read the DCP index (.metadata): corrupt or not a pickle (UnpicklingError: pickle data was truncated)"
    )
    _cli_fails_with(ck, "cannot read the DCP index (.metadata): corrupt or not a pickle")
    # a valid pickle of something else
    (ck / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    ((code, msg),) = _errors(verify_checkpoint(ck))
    assert msg.startswith("corrupt .metadata: it holds a dict, not torch DCP Metadata")


def test_common_state_with_forbidden_global(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    import argparse

    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /dev/null",))

    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "iter_0000005")
    torch.save({"args": argparse.Namespace(num_layers=2, hook=Evil()), "iteration": 5}, ck / "common.pt")
    report = verify_checkpoint(ck)
    ((code, msg),) = _errors(report)
    assert code == "common-state"
    assert msg.startswith("refusing to unpickle: the pickle asks for posix.system, which is not on")
    _cli_fails_with(ck, "refusing to unpickle: the pickle asks for posix.system")
    res = cli("ckpt", "inspect", ck)
    assert res.exit_code == 2 and "refusing to unpickle" in " ".join(res.output.split())


def _bad_tar(path: Path, src: Path, kind: str) -> Path:
    with tarfile.open(path, "w") as tar:
        tar.add(src, arcname="ckpt")
        if kind == "dotdot":
            ti = tarfile.TarInfo("ckpt/../../evil.txt")
            ti.size = 4
            import io

            tar.addfile(ti, io.BytesIO(b"evil"))
        elif kind == "absolute":
            ti = tarfile.TarInfo("/tmp/evil.txt")
            ti.size = 4
            import io

            tar.addfile(ti, io.BytesIO(b"evil"))
        elif kind == "symlink":
            ti = tarfile.TarInfo("ckpt/escape")
            ti.type = tarfile.SYMTYPE
            ti.linkname = "../../../etc/passwd"
            tar.addfile(ti)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            "dotdot",
            "archive member 'ckpt/../../evil.txt' is unsafe (path with '..' leaving the target directory)",
        ),
        ("absolute", "archive member '/tmp/evil.txt' is unsafe (absolute path)"),
        (
            "symlink",
            "archive member 'ckpt/escape' is unsafe (link to '../../../etc/passwd' leaving the target directory)",
        ),
    ],
)
def test_unsafe_archives_fail_verify(
    megatron_checkpoints: CheckpointFixtures, tmp_path: Path, kind: str, message: str
) -> None:
    tar = _bad_tar(tmp_path / f"{kind}.tar", megatron_checkpoints.iter_dir("gqa"), kind)
    report = verify_checkpoint(tar)
    assert _errors(report) == [("unsafe-member", message + "; extraction would refuse it")]
    _cli_fails_with(tar, message)


def test_deep_manifest_write_check_tamper(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    ck = copy_checkpoint(megatron_checkpoints.iter_dir("gqa_opt"), tmp_path / "iter_0000010")
    before = sorted(p.name for p in ck.iterdir())
    manifest = tmp_path / "gqa_opt.sha256"
    report = verify_checkpoint(ck, deep=True, write_manifest=manifest, workers=2)
    assert report.ok and report.deep.files == len(before)
    assert sorted(p.name for p in ck.iterdir()) == before  # nothing written into the checkpoint
    lines = manifest.read_text().splitlines()
    assert len(lines) == len(before) and all(len(line.split("  ")[0]) == 64 for line in lines)
    from longctx.util.hashing import sha256_file

    digest, name = lines[0].split("  ")
    assert sha256_file(ck / name) == digest  # sha256sum-compatible
    ok = verify_checkpoint(ck, deep=True, manifest=manifest)
    assert ok.ok and "sha256-ok" in ok.findings.codes("info")
    # flip one byte in a shard
    shard = ck / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = verify_checkpoint(ck, deep=True, manifest=manifest)
    assert _errors(bad) == [("sha256-mismatch", "__0_0.distcp: sha256 differs from the manifest")]
    assert verify_checkpoint(ck).ok  # shallow checks cannot see it
    res = cli("ckpt", "check", ck, "--deep", "--manifest", manifest)
    assert res.exit_code == 2 and "__0_0.distcp: sha256 differs from the manifest" in res.output
    # a SHA256SUMS shipped inside the checkpoint is used when no --manifest is given
    (ck / "SHA256SUMS").write_text(manifest.read_text())
    inner = verify_checkpoint(ck, deep=True)
    assert inner.deep.manifest_checked.endswith("SHA256SUMS")
    assert _errors(inner) == [("sha256-mismatch", "__0_0.distcp: sha256 differs from the manifest")]


def test_deep_on_archive_and_json(ermine_archives: dict[str, Path], tmp_path: Path) -> None:
    manifest = tmp_path / "nested.sha256"
    res = cli("ckpt", "check", ermine_archives["nested"], "--deep", "--write-manifest", manifest, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["ok"] and data["deep"]["files"] == 5 and data["deep"]["manifest_written"] == str(manifest)
    assert set(data["deep"]["digests"]) == {
        ".metadata",
        "__0_0.distcp",
        "__0_1.distcp",
        "common.pt",
        "metadata.json",
    }


def test_manifest_options_need_deep(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    res = cli("ckpt", "check", megatron_checkpoints.save_dir("gqa"), "--write-manifest", tmp_path / "m")
    assert res.exit_code == 2 and "--manifest/--write-manifest need --deep" in res.output


def test_sparse_baby_layout_reads_no_shard(tmp_path: Path) -> None:
    """The baby_9b_dense-shaped index over sparse shards: whole, and no .distcp is ever opened."""
    from longctx.bench.ckpt import build_baby_like
    from longctx.checkpoint import inspect_checkpoint

    root = tmp_path / "baby"
    build_baby_like(root, n_files=64, dp=4)
    opened: list[str] = []
    from longctx.bench.ckpt import _OpenCounter

    counter = _OpenCounter.get()
    counter.opened.clear()
    counter.active = True
    try:
        report = inspect_checkpoint(root)
        verification = verify_checkpoint(root)
    finally:
        counter.active = False
        opened = list(counter.opened)
    assert verification.ok, verification.findings
    assert not [p for p in opened if p.endswith(".distcp")]
    a = report.arch
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads, a.num_query_groups) == (
        36,
        4096,
        12288,
        32,
        8,
    )
    assert (a.kv_channels, a.padded_vocab_size, report.iteration) == (128, 262656, 76800)
    assert report.optimizer.layout == "dp_reshardable" and report.optimizer.dp_groups == 4
    assert report.files_bytes > 100 * 2**30  # ~119 GiB of sparse shards
    os.truncate(root / "__7_0.distcp", 10)
    bad = verify_checkpoint(root)
    assert [f.code for f in bad.findings.errors] == ["truncated-shard"]
