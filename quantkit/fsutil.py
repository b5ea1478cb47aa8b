"""Files: atomic output folders, hashes, JSON writing that is byte-stable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps(data: Any) -> str:
    """Deterministic JSON text (sorted keys, trailing newline)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    path.write_text(dumps(data), encoding="utf-8")


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse an existing output folder unless --force (checked before any work)."""
    if out.exists() and not force:
        raise BadInput(f"output folder {out} already exists",
                       "choose another --out, or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise BadInput(f"output path {out} exists and is not a folder", "choose another --out")


@contextmanager
def atomic_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to `out` only when the block succeeds."""
    check_output_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".quantkit-tmp-{out.name}-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
