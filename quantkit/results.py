"""`results.json` of a validation, as a `Results`: written by validate, read by report, serve and
run as data. The schema version is checked on read. Its task results and gate are kept as the
file holds them; `task_results` and `decision` read them through the contract (quantkit.contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.contract import GateDecision, TaskResult
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

    FILE, KIND, VERSION, HINT = RESULTS, "results", SCHEMA_VERSION, "re-run `quantkit validate`"

    @property
    def verdict(self) -> str:
        """pass, fail or not gated."""
        return self.decision.verdict

    @property
    def decision(self) -> GateDecision:
        """The gate's decision, typed."""
        return GateDecision.from_dict(self.gate)

    @property
    def task_results(self) -> dict[str, TaskResult]:
        """Each task's result, typed (its metrics, sides, seconds and the rest)."""
        return {name: TaskResult.from_dict(t) for name, t in self.tasks.items()
                if isinstance(t, Mapping)}

    @classmethod
    def missing(cls, folder: Path) -> tuple[str, str]:
        return (f"no {RESULTS} in {folder}",
                f"run `quantkit validate ... --out {folder}` first")

    @classmethod
    def _build(cls, data: dict[str, Any], where: str) -> Results:
        try:
            res = cls(**data)
        except TypeError as exc:
            raise BadInput(f"{where} is not complete ({exc})", cls.HINT) from exc
        for name, kind in (("artifact", dict), ("baseline", dict), ("tasks", dict),
                           ("gate", dict), ("settings", dict), ("engine", str)):
            if not isinstance(getattr(res, name), kind):
                raise BadInput(f"{where}: {name} has the wrong type", cls.HINT)
        return res


def calibration_match(results: Mapping[str, Any] | Results) -> dict[str, Any] | None:
    """The calibration set's match to the domain set (JS divergence, coverage, `poor`), wherever
    a results.json holds it: measured by validate, or recorded when the set was built."""
    calib = (results.calibration if isinstance(results, Results)
             else results.get("calibration")) or {}
    match = calib.get("target_match") or (calib.get("stats") or {}).get("target_match")
    return match if isinstance(match, dict) else None
