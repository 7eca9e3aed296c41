"""Import every module the device check runs and the packages they need, before any step: a missing or
too old wheel is named here, in one line each, instead of failing a step minutes later.

    python3 scripts/device-imports.py    # exits 1 when anything does not import
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys

# the wheels scripts/device-wheels carries and the minimum each needs on the device image
MINIMUM = {"typing-extensions": (4, 16), "pydantic": (2, 14), "megatron-core": (0, 16), "typer": (0, 29)}
PACKAGES = ("torch", "numpy", "megatron.core", "pydantic", "typing_extensions", "typer", "rich",
            "sentencepiece", "tokenizers", "transformers", "safetensors", "psutil", "tensorboard",
            "pytest")  # fmt: skip


def _version(dist: str) -> tuple[int, ...]:
    text = importlib.metadata.version(dist)
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def main() -> int:
    failures = []
    for dist, floor in MINIMUM.items():
        try:
            if _version(dist) < floor:
                failures.append(
                    f"{dist} {importlib.metadata.version(dist)} is older than {'.'.join(map(str, floor))}"
                )
        except importlib.metadata.PackageNotFoundError:
            failures.append(f"{dist} is not installed")
    names = list(PACKAGES)
    import longctx

    names += [m.name for m in pkgutil.walk_packages(longctx.__path__, "longctx.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # every module is tried; each failure is one line
            failures.append(f"{name}: {type(err).__name__}: {err}")
    for line in failures:
        print(f"import check: {line}")
    print(f"import check: {len(names)} modules, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
