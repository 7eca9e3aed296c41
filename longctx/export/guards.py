"""What `export hf` refuses about its inputs beyond the model: an output inside the checkpoint it reads,
files of the checkpoint that lead outside it, a tokenizer that no longer encodes as its manifest pinned,
and shards that do not hold what their index says (truncated, zero-filled, a pickle where a tensor is)."""

from __future__ import annotations

import os
import pickle
import stat
from collections.abc import Sequence
from pathlib import Path

import torch

from longctx.errors import ExportError
from longctx.export.reader import DcpReader
from longctx.tokenizer import LoadedTokenizer, TokenizerManifest
from longctx.tokenizer.encoding import encoding_differences

# what torch and DCP raise on a shard whose bytes are not what the index says (EOFError included: left to
# click, it becomes a bare "Aborted.")
_DAMAGED = (
    RuntimeError,
    ValueError,
    EOFError,
    OSError,
    KeyError,
    IndexError,
    TypeError,
    AssertionError,
    pickle.UnpicklingError,
    AttributeError,
    ImportError,
)


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def refuse_out_inside(out: Path, *inputs: Path) -> None:
    """The export never writes into what it reads."""
    for root in inputs:
        if _inside(out, root):
            raise ExportError(
                "the output directory lies inside the checkpoint being exported; inputs are never written",
                where=str(out),
                fix=f"give an --out outside {root}",
            )


def refuse_outside_files(directory: Path, requested: Path) -> None:
    """Every entry of the checkpoint directory is a regular file or directory of it: a symbolic link that
    leads out of it (or a FIFO, a device) would make the export read what is not the checkpoint."""
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode) and _inside(p, directory):
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                what = (
                    f"a symbolic link to {os.readlink(p)}"
                    if stat.S_ISLNK(st.st_mode)
                    else "not a regular file"
                )
                raise ExportError(
                    f"{name} in the checkpoint is {what}; the export reads only the checkpoint's own files",
                    where=str(p),
                    fix=f"copy the real file into {directory} (or export the checkpoint where it lies: "
                    f"{requested})",
                )


def check_encoding(tok: LoadedTokenizer, manifest: TokenizerManifest) -> None:
    """A manifest that pins an encoding ([encoding]) must still describe how the tokenizer encodes."""
    if manifest.encoding is None:
        return
    diffs = encoding_differences(manifest.encoding, tok.encoding_fingerprint())
    if diffs:
        raise ExportError(
            f"the tokenizer does not encode as its manifest's [encoding] pins ({'; '.join(diffs)}); the exported "
            "model would be served with another encoding than it was trained on",
            where=str(tok.path),
            fix="export with the tokenizer and manifest the checkpoint was trained with (longctx tokenizer "
            "verify shows the difference)",
        )


def read_region(
    reader: DcpReader, key: str, offsets: Sequence[int] | None, sizes: Sequence[int] | None
) -> torch.Tensor:
    """`reader.read`, with a damaged shard turned into an ExportError that names the tensor."""
    try:
        return reader.read(key, offsets, sizes)
    except ExportError:
        raise
    except _DAMAGED as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        if "weights_only" in first:  # torch's advice to unpickle untrusted bytes: never the fix here
            first = "a shard item is not a plain tensor"
        raise ExportError(
            f"cannot read tensor {key} from the checkpoint's shard files ({type(err).__name__}: {first}); "
            "a shard is damaged (truncated, overwritten, or not the index's)",
            where=str(reader.directory),
            fix="export another save of this stage, or copy this save again; `longctx ckpt check --deep` "
            "reads every shard",
        ) from None
