"""Artifacts describe themselves: `quantkit.json` holds provenance, parameters, hashes, versions, timings."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.errors import BadInput

MANIFEST = "quantkit.json"
SCHEMA_VERSION = 1


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the engines an artifact depends on."""
    found = {"quantkit": __version__}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def read_manifest(path: Path) -> dict[str, Any]:
    """An artifact's manifest, or a BadInput saying it is not a quantkit artifact."""
    file = path / MANIFEST
    if not file.is_file():
        raise BadInput(f"{path} is not a quantkit artifact (no {MANIFEST})",
                       "make one with `quantkit quantize`")
    try:
        data: dict[str, Any] = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise BadInput(f"{file} is corrupt", "re-run `quantkit quantize`") from exc
    return data


def folder_size(path: Path, pattern: str = "*.safetensors") -> int:
    """Bytes of the weight files in a folder."""
    return sum(f.stat().st_size for f in path.glob(pattern))
