"""Streaming file digests (md5 for tokenizer identity, sha256 for integrity manifests)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

CHUNK = 8 * 1024 * 1024


def file_digest(
    path: str | os.PathLike[str],
    algorithm: str = "sha256",
    *,
    on_bytes: Callable[[int], None] | None = None,
    chunk_size: int = CHUNK,
) -> str:
    """Hex digest of a file read in chunks; `on_bytes(n)` is called after each chunk (progress)."""
    h = hashlib.new(algorithm)
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(chunk_size)
        view = memoryview(buf)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


def md5_file(path: str | os.PathLike[str]) -> str:
    return file_digest(path, "md5")


def sha256_file(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None) -> str:
    return file_digest(path, "sha256", on_bytes=on_bytes)


def is_hex_digest(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value.lower())
