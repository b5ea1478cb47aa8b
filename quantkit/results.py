"""`results.json` of a validation, as a `Results`: written by validate, read by report, serve and
run as data. The schema version is checked on read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput

RESULTS = "results.json"
# 2: per-task seconds split into baseline and quantized; the manifest is schema 2
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Results:
    """One validation: what was compared, on which engine, with what settings, and the verdict."""

    quantkit_version: str
    created: str
    artifact: dict[str, Any]          # path, sha256 (of the weights file(s)), manifest
    baseline: dict[str, Any]          # path, sha256, label, source_match
    engine: str
    settings: dict[str, Any]
    thresholds: dict[str, dict[str, float]]
    tasks: dict[str, Any]             # task -> quantized, baseline, metrics, seconds
    gate: dict[str, Any]              # verdict, checks, failing, causes
    timings: dict[str, float]
    calibration: dict[str, Any] | None = None
    engine_version: str = ""
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """pass, fail or not gated."""
        return str(self.gate.get("verdict"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return dataclasses.asdict(self)

    def write(self, folder: Path) -> None:
        """`folder/results.json`."""
        from quantkit.fsutil import dumps

        (Path(folder) / RESULTS).write_text(dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Results:
        """Check the schema version and fields; BadInput naming `where` otherwise."""
        from quantkit.fsutil import check_versioned

        data = check_versioned(data, where, kind="results", version=SCHEMA_VERSION,
                               fields=_FIELDS, hint=_HINT)
        try:
            res = cls(**data)
        except TypeError as exc:
            raise BadInput(f"{where} is not complete ({exc})", _HINT) from exc
        for name, kind in (("artifact", dict), ("baseline", dict), ("tasks", dict),
                           ("gate", dict), ("settings", dict), ("engine", str)):
            if not isinstance(getattr(res, name), kind):
                raise BadInput(f"{where}: {name} has the wrong type", _HINT)
        return res

    @classmethod
    def read(cls, folder: Path) -> Results:
        """`folder/results.json`, or a BadInput saying why it cannot be used."""
        from quantkit.fsutil import read_json_file

        file = Path(folder) / RESULTS
        data = read_json_file(file, f"no {RESULTS} in {folder}",
                              f"run `quantkit validate ... --out {folder}` first", _HINT)
        return cls.from_dict(data, str(file))


_FIELDS = {f.name for f in dataclasses.fields(Results)}
_HINT = "re-run `quantkit validate`"
