"""download: huggingface_hub's real snapshot logic against a fake Hub transport, then verify + adopt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint import download, inspect_checkpoint, read_tracker
from longctx.cli.main import app
from longctx.errors import CheckpointError
from tests.fixtures.checkpoint import CheckpointFixtures

runner = CliRunner()


def _repo(directory: Path, prefix: str = "") -> dict[str, Path]:
    return {prefix + p.name: p for p in directory.iterdir() if p.is_file()}


def _go_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1, and any request that still went out would fail."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    def refuse(request: object) -> object:
        raise AssertionError(f"network used while offline: {request}")

    # the real client's request hook is what enforces HF_HUB_OFFLINE; keep it, and fail behind it
    _http.set_client_factory(
        lambda: httpx2.Client(
            transport=httpx2.MockTransport(refuse), event_hooks={"request": [_http.hf_request_event_hook]}
        )
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_flat_repo_download_then_offline(fake_hub, flat_snapshot: Path, tmp_path: Path, monkeypatch) -> None:
    hub = fake_hub({"oellm/baby-like": _repo(flat_snapshot)})
    cache = tmp_path / "hf-cache"
    r = download("oellm/baby-like", tmp_path / "base", cache_dir=cache)
    assert r.checkpoint_source == "" and r.adopted is not None
    assert (r.adopted.iteration, r.adopted.method) == (10, "hardlink") and r.adopted.verify.ok
    assert read_tracker(tmp_path / "base").iteration == 10
    shard = r.adopted.checkpoint_dir / "__0_0.distcp"
    assert os.path.samefile(shard, os.path.realpath(r.snapshot_dir / "__0_0.distcp"))  # linked from blobs/
    assert any(m == "GET" and u.endswith("/__0_0.distcp") for m, u, _ in hub.requests)

    _go_offline(monkeypatch)
    again = download("oellm/baby-like", tmp_path / "base2", cache_dir=cache)
    assert again.adopted is not None and again.adopted.verify.ok
    assert inspect_checkpoint(tmp_path / "base2").arch.padded_vocab_size == 640
    res = runner.invoke(
        app,
        [
            "ckpt",
            "fetch",
            "oellm/baby-like",
            "--into",
            str(tmp_path / "base3"),
            "--cache-dir",
            str(cache),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["adopted"]["iteration"] == 10 and data["adopted"]["ok"]


def test_offline_without_cache(tmp_path: Path, monkeypatch) -> None:
    _go_offline(monkeypatch)
    with pytest.raises(CheckpointError) as ei:
        download("oellm/never-downloaded", tmp_path / "base", cache_dir=tmp_path / "empty-cache")
    assert ei.value.what.startswith(
        "the Hub cannot be reached (offline) and the cache holds no complete snapshot of this revision"
    )
    assert ei.value.where == "oellm/never-downloaded@main"
    from huggingface_hub.utils import _http

    _http.set_client_factory(_http.default_client_factory)


def test_ermine_repo_patterns(
    fake_hub, ermine_archives: dict[str, Path], oellm_like_hf_dir: Path, tmp_path: Path
) -> None:
    files = {"x_model_only.tar": ermine_archives["plain"], "moe_model_only.tar": ermine_archives["moe"]}
    files.update(_repo(oellm_like_hf_dir, "tokenizer/"))
    hub = fake_hub({"ermine/suite": files})
    cache = tmp_path / "cache"
    # only the tokenizer: nothing to adopt, the files are linked into the target
    tok = download("ermine/suite", tmp_path / "tok", include=["tokenizer/*"], cache_dir=cache)
    assert tok.adopted is None and tok.checkpoint_source is None
    assert sorted(tok.extra_files) == sorted(f"tokenizer/{p.name}" for p in oellm_like_hf_dir.iterdir())
    assert (tmp_path / "tok" / "tokenizer" / "tokenizer.model").is_file()
    assert not any(u.endswith(".tar") for _, u, _ in hub.requests)  # archives were not fetched
    # one archive: extracted into the save layout
    arm = download("ermine/suite", tmp_path / "moe", include=["moe_model_only.tar"], cache_dir=cache)
    assert arm.checkpoint_source == "moe_model_only.tar" and arm.adopted.method == "extract"
    assert inspect_checkpoint(tmp_path / "moe").arch.num_experts == 4
    # both archives: ambiguous
    with pytest.raises(CheckpointError) as ei:
        download("ermine/suite", tmp_path / "both", include=["*.tar"], cache_dir=cache)
    assert ei.value.what == "2 archives were downloaded (moe_model_only.tar, x_model_only.tar)"
    assert ei.value.fix == "pass --include with one archive's name to adopt it"
    with pytest.raises(CheckpointError, match="no file of the snapshot matches"):
        download("ermine/suite", tmp_path / "none", include=["nothing-*"], cache_dir=cache)


def test_interrupted_download_resumes(
    fake_hub, megatron_checkpoints: CheckpointFixtures, tmp_path: Path
) -> None:
    hub = fake_hub({"org/tp2": _repo(megatron_checkpoints.iter_dir("tp2"), "iter_0000020/")})
    hub.fail_once.add("iter_0000020/__1_1.distcp")
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError) as ei:
        download("org/tp2", tmp_path / "base", cache_dir=cache)
    assert ei.value.what.startswith("download interrupted:")
    assert (
        ei.value.fix == "run the same command again: finished files stay in the cache and partial ones resume"
    )
    assert not (tmp_path / "base" / "iter_0000020").exists()
    finished = {p.name for p in (cache / "models--org--tp2").glob("snapshots/*/iter_0000020/*")}
    assert finished  # some files completed before the break
    hub.requests.clear()
    r = download("org/tp2", tmp_path / "base", cache_dir=cache)
    again = {u.rsplit("/", 1)[-1] for m, u, _ in hub.requests if m == "GET" and "/resolve/" in u}
    assert "__1_1.distcp" in again and not (again & finished)  # finished files are not fetched again
    assert (r.checkpoint_source, r.adopted.iteration) == ("iter_0000020", 20)
    assert (
        r.adopted.verify.ok
        and inspect_checkpoint(tmp_path / "base").tensor_model_parallel_size_from_layout == 2
    )
