"""`results.json` of a validation, as a `Results`: written by validate, read by report, serve and
run as data. The schema version is checked on read. What it compared (`artifact`, `baseline`), its
task results and its gate are the contract's dataclasses (quantkit.contract), read from the file's
dicts and written back as they were (`from_dict`/`to_dict`, at the file only)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.contract import ArtifactRecord, BaselineRecord, GateDecision, TaskResult
from quantkit.errors import BadInput
from quantkit.fsutil import VersionedFile

RESULTS = "results.json"
CARD = "model-card.md"  # `quantkit card`'s default: beside results.json, where the report links it
# 2: per-task seconds split into baseline and quantized; the manifest is schema 2
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Results(VersionedFile):
    """One validation: what was compared, on which engine, with what settings, and the verdict."""

    quantkit_version: str
    created: str
    artifact: ArtifactRecord
    baseline: BaselineRecord
    engine: str
    settings: dict[str, Any]  # open: each task's own settings (a plugin's keys too)
    thresholds: dict[str, dict[str, float]]
    tasks: dict[str, TaskResult]
    gate: GateDecision
    timings: dict[str, float]
    calibration: dict[str, Any] | None = None  # the calibration set's manifest: calib's, open
    engine_version: str = ""
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # open JSON, kept as read

    FILE, KIND, VERSION, HINT = RESULTS, "results", SCHEMA_VERSION, "re-run `quantkit validate`"

    @property
    def verdict(self) -> str:
        """pass, fail or not gated."""
        return self.decision.verdict

    @property
    def decision(self) -> GateDecision:
        """The gate's decision."""
        return self.gate

    @property
    def task_results(self) -> dict[str, TaskResult]:
        """Each task's result (its metrics, sides, seconds and the rest)."""
        return self.tasks

    def to_dict(self) -> dict[str, Any]:
        """As results.json holds it."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return copy.deepcopy({**data, "artifact": self.artifact.to_dict(),
                              "baseline": self.baseline.to_dict(),
                              "tasks": {k: t.to_dict() for k, t in self.tasks.items()},
                              "gate": self.gate.to_dict()})

    @classmethod
    def missing(cls, folder: Path) -> tuple[str, str]:
        return (f"no {RESULTS} in {folder}",
                f"run `quantkit validate ... --out {folder}` first")

    @classmethod
    def _build(cls, data: dict[str, Any], where: str) -> Results:
        for name, kind in (("artifact", dict), ("baseline", dict), ("tasks", dict),
                           ("gate", dict), ("settings", dict), ("engine", str)):
            if name in data and not isinstance(data[name], kind):
                raise BadInput(f"{where}: {name} has the wrong type", cls.HINT)
        records = {**data}
        if "artifact" in data:
            records["artifact"] = ArtifactRecord.from_dict(data["artifact"])
        if "baseline" in data:
            records["baseline"] = BaselineRecord.from_dict(data["baseline"])
        if "tasks" in data:
            records["tasks"] = {name: TaskResult.from_dict(t) for name, t in data["tasks"].items()
                                if isinstance(t, Mapping)}
        if "gate" in data:
            records["gate"] = GateDecision.from_dict(data["gate"])
        try:
            return cls(**records)
        except TypeError as exc:
            raise BadInput(f"{where} is not complete ({exc})", cls.HINT) from exc


def calibration_match(results: Mapping[str, Any] | Results) -> dict[str, Any] | None:
    """The calibration set's match to the domain set (JS divergence, coverage, `poor`), wherever
    a results.json holds it: measured by validate, or recorded when the set was built."""
    calib = (results.calibration if isinstance(results, Results)
             else results.get("calibration")) or {}
    match = calib.get("target_match") or (calib.get("stats") or {}).get("target_match")
    return match if isinstance(match, dict) else None
