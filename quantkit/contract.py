"""The validation contract: what a task, the gate and `quantkit auto` hand on, as dataclasses.

results.json, junit.xml, auto.json and `--json` keep the shapes they always had: each class reads
one with `from_dict` (tolerant of older files: a key they lack is None) and writes it with
`to_dict` (`dataclasses.asdict`, where the optional keys that were absent stay absent), so a file
read and written again is the same. The gate, the summary, `quantkit auto`, the report and the
server read attributes. Pure: no torch, no import of the stages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from quantkit.records import (
    AutoRecord,
    CandidateMetricRecord,
    CandidateRecord,
    GateCheckRecord,
    GateDecisionRecord,
    Speed,
    TaskSecondsRecord,
    UsageRecord,
)


def _without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`data` less the optional `keys` whose value is None (they were absent, or never set)."""
    return {k: v for k, v in data.items() if not (k in keys and v is None)}


@dataclass(frozen=True)
class MetricValue:
    """A compared metric: its value, 95% interval (None where not finite), the items compared,
    and a note where the value carries no signal ("no signal: 0/10 on both")."""

    value: float
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this class does not know

    @staticmethod
    def shaped(data: Any) -> bool:
        """Whether `data` is a metric: a MetricValue, or one as results.json holds it (value, lo,
        hi)."""
        return isinstance(data, MetricValue) or (isinstance(data, Mapping)
                                                 and {"value", "lo", "hi"} <= set(data))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | MetricValue) -> MetricValue:
        if isinstance(data, MetricValue):
            return data
        known = {"value", "lo", "hi", "n", "note"}
        value = data["value"] if data["value"] is not None else math.nan  # written as null
        return cls(value, data.get("lo"), data.get("hi"), data.get("n"), data.get("note"),
                   {k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        extra = data.pop("extra")
        return {**_without(data, "n", "note"), **extra}

    def with_note(self, note: str) -> MetricValue:
        return dataclasses.replace(self, note=note)


@dataclass(frozen=True)
class TaskSeconds:
    """Inference seconds of one task on each side; the baseline's 0 where the cache answered."""

    baseline: float | None = None
    quantized: float | None = None
    baseline_cached: bool | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSeconds:
        return cls(data.get("baseline"), data.get("quantized"), data.get("baseline_cached"))

    def to_dict(self) -> TaskSecondsRecord:
        out: TaskSecondsRecord = {}
        if self.baseline is not None:
            out["baseline"] = self.baseline
        if self.quantized is not None:
            out["quantized"] = self.quantized
        if self.baseline_cached is not None:
            out["baseline_cached"] = self.baseline_cached
        return out


SIDES = ("quantized", "baseline")


@dataclass(frozen=True)
class TaskResult:
    """One task's result, what its run function returns: both sides as the task recorded them,
    its compared metrics, the seconds each side took, what running it cost (`resources`: wall
    time, peak CPU and GPU memory), and what else the task keeps (`extra`: HumanEval's changed
    problems, the domain file, a sandbox warning ...). In results.json its metrics are keys of
    the task's object beside the sides (every key shaped as a metric)."""

    quantized: Any = None
    baseline: Any = None
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    seconds: TaskSeconds | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    resources: UsageRecord | None = None

    def metric(self, key: str) -> MetricValue | None:
        return self.metrics.get(key)

    @classmethod
    def of(cls, data: TaskResult | Mapping[str, Any]) -> TaskResult:
        """A task's result as a run function returns it: a TaskResult, or (a plugin's) the dict
        results.json holds, its metrics MetricValues or dicts."""
        return data if isinstance(data, TaskResult) else cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskResult:
        metrics = {k: MetricValue.from_dict(v) for k, v in data.items()
                   if k not in SIDES and MetricValue.shaped(v)}
        seconds, resources = data.get("seconds"), data.get("resources")
        return cls(data.get("quantized"), data.get("baseline"), metrics,
                   TaskSeconds.from_dict(seconds) if isinstance(seconds, Mapping) else None,
                   {k: v for k, v in data.items()
                    if k not in (*SIDES, "seconds", "resources") and k not in metrics},
                   cast(UsageRecord, dict(resources)) if isinstance(resources, Mapping)
                   else None)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in SIDES if getattr(self, k) is not None}
        out.update({k: m.to_dict() for k, m in self.metrics.items()})
        out.update(self.extra)
        if self.seconds is not None:
            out["seconds"] = self.seconds.to_dict()
        if self.resources is not None:
            out["resources"] = dict(self.resources)
        return out


@dataclass(frozen=True)
class ArtifactRecord:
    """The artifact a validation compared (results.json's `artifact`): its path, the sha256 of
    its model file(s) and its manifest (quantkit.json) as it was then; a key absent from the file
    is None."""

    path: str | None = None
    sha256: str | None = None
    manifest: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this class does not know

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArtifactRecord:
        return cls(data.get("path"), data.get("sha256"), data.get("manifest"),
                   {k: v for k, v in data.items() if k not in ("path", "sha256", "manifest")})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        extra = data.pop("extra")
        return {**_without(data, "path", "sha256", "manifest"), **extra}


@dataclass(frozen=True)
class BaselineRecord:
    """The original a validation compared against (results.json's `baseline`): its path, sha256
    (of its identity), the name it was given, and whether it is the artifact's source."""

    path: str | None = None
    sha256: str | None = None
    label: str | None = None
    source_match: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this class does not know

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineRecord:
        known = ("path", "sha256", "label", "source_match")
        return cls(data.get("path"), data.get("sha256"), data.get("label"),
                   data.get("source_match"), {k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        extra = data.pop("extra")
        return {**_without(data, "path", "sha256", "label", "source_match"), **extra}


@dataclass(frozen=True)
class GateCheck:
    """One threshold against its measured value (None: not measured) and interval."""

    task: str
    metric: str
    op: str  # ">=" or "<="
    limit: float
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    passed: bool = False
    too_small: bool = False  # the interval straddles the limit: the sample cannot decide
    note: str | None = None

    @property
    def name(self) -> str:
        return f"{self.task}.{self.metric}"

    @property
    def no_signal(self) -> bool:
        """The original scores 0 too (the metric's note, validate.stats.no_signal): a retention
        that says nothing."""
        return (self.note or "").startswith("no signal")

    @property
    def unmeasured(self) -> bool:
        """Nothing was measured against the limit: the task produced no value, or one without
        signal, which says nothing about what quantization kept."""
        return self.value is None or self.no_signal

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateCheck:
        return cls(str(data.get("task")), str(data.get("metric")), str(data.get("op")),
                   data.get("limit"),  # type: ignore[arg-type]
                   data.get("value"), data.get("lo"), data.get("hi"), data.get("n"),
                   bool(data.get("passed")), bool(data.get("too_small")), data.get("note"))

    def to_dict(self) -> GateCheckRecord:
        data: GateCheckRecord
        task, metric, op, limit, value = self.task, self.metric, self.op, self.limit, self.value
        passed, too_small = self.passed, self.too_small
        if value is None:  # not measured: no interval to show
            data = {"task": task, "metric": metric, "op": op, "limit": limit, "value": value,
                    "passed": passed, "too_small": too_small}
        elif self.n is None:
            data = {"task": task, "metric": metric, "op": op, "limit": limit, "value": value,
                    "lo": self.lo, "hi": self.hi, "passed": passed, "too_small": too_small}
        else:
            data = {"task": task, "metric": metric, "op": op, "limit": limit, "value": value,
                    "lo": self.lo, "hi": self.hi, "n": self.n, "passed": passed,
                    "too_small": too_small}
        if self.note is not None:
            data["note"] = self.note
        return data


@dataclass(frozen=True)
class GateDecision:
    """The gate's verdict (pass, fail, not gated), each check, the failing ones by name, and the
    usual causes of a failure."""

    verdict: str
    checks: list[GateCheck] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)
    causes: list[str] | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GateDecision:
        data = data or {}
        return cls(str(data.get("verdict") or "not gated"),
                   [GateCheck.from_dict(c) for c in data.get("checks") or []],
                   list(data.get("failing") or []),
                   list(data["causes"]) if data.get("causes") is not None else None)

    def to_dict(self) -> GateDecisionRecord:
        data: GateDecisionRecord = {"verdict": self.verdict,
                                    "checks": [c.to_dict() for c in self.checks],
                                    "failing": list(self.failing)}
        if self.causes is not None:
            data["causes"] = self.causes
        return data


@dataclass(frozen=True)
class ModelPair:
    """The quantized model and its baseline as files for one engine, and whether they belong."""

    engine: str
    quantized_path: Path
    baseline_path: Path
    artifact_sha256: str
    baseline_sha256: str
    manifest: Any  # the artifact's Manifest
    model_dir: Path  # the original model's folder (its tokenizer)
    source_match: bool
    dtype: str | None = None  # what the engine computes the baseline in here (None: not said)
    mode: str | None = None  # how the engine runs here beyond that (EngineSpec.mode; None: not said)

    def path(self, which: str) -> Path:
        """The model file(s) of `which` side: quantized or baseline."""
        return self.quantized_path if which == "quantized" else self.baseline_path


@dataclass(frozen=True)
class CandidateMetric:
    """One gated metric of a candidate `quantkit auto` tried, against its limit."""

    value: float | None
    lo: float | None
    hi: float | None
    limit: float
    op: str
    passed: bool
    note: str | None = None

    @classmethod
    def of(cls, check: GateCheck) -> CandidateMetric:
        return cls(check.value, check.lo, check.hi, check.limit, check.op, check.passed,
                   check.note)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CandidateMetric:
        return cls(data.get("value"), data.get("lo"), data.get("hi"),
                   data.get("limit"),  # type: ignore[arg-type]
                   str(data.get("op")), bool(data.get("passed")), data.get("note"))

    def to_dict(self) -> CandidateMetricRecord:
        data: CandidateMetricRecord = {"value": self.value, "lo": self.lo, "hi": self.hi,
                                       "limit": self.limit, "op": self.op,
                                       "passed": self.passed}
        if self.note is not None:
            data["note"] = self.note
        return data


@dataclass
class Candidate:
    """A candidate `quantkit auto` tried: what it is, its size, the verdict and its metrics; with
    --load its `speed` (quantkit.speed's figures); the chosen one says why (`reason`)."""

    name: str
    method: str | None = None
    bits: int | None = None
    group_size: int | None = None
    quant_type: str | None = None
    bits_per_weight: float | None = None
    size_bytes: int = 0
    verdict: str | None = None  # pass, fail, or rejected (on the early tasks)
    metrics: dict[str, CandidateMetric] = field(default_factory=dict)
    seconds: float | None = None
    speed: Speed | None = None
    reason: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in data.items() if k in known}
        given["metrics"] = {k: CandidateMetric.from_dict(m)
                            for k, m in (data.get("metrics") or {}).items()}
        return cls(**given)

    def to_dict(self) -> CandidateRecord:
        data: CandidateRecord = {
            "name": self.name, "method": self.method, "bits": self.bits,
            "group_size": self.group_size, "quant_type": self.quant_type,
            "bits_per_weight": self.bits_per_weight, "size_bytes": self.size_bytes,
            "verdict": self.verdict, "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
            "seconds": self.seconds}
        if self.speed is not None:
            data["speed"] = self.speed
        if self.reason is not None:
            data["reason"] = self.reason
        return data


@dataclass(frozen=True)
class AutoResult:
    """`quantkit auto`'s search: every candidate tried, the one chosen (None: none passed), those
    skipped and larger ones to try, where OUT and the report went; with --load the concurrencies,
    the preference and the original's speed."""

    method: str
    candidates: list[Candidate]
    chosen: Candidate | None
    skipped: list[str] = field(default_factory=list)
    larger: list[str] = field(default_factory=list)
    out: str | None = None
    report: str | None = None
    load: list[int] | None = None
    prefer: str | None = None
    reference: Speed | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoResult:
        chosen = data.get("chosen")
        return cls(str(data.get("method")), [Candidate.from_dict(c) for c in
                                             data.get("candidates") or []],
                   Candidate.from_dict(chosen) if isinstance(chosen, Mapping) else None,
                   list(data.get("skipped") or []), list(data.get("larger") or []),
                   data.get("out"), data.get("report"), data.get("load"), data.get("prefer"),
                   data.get("reference"))

    def to_dict(self) -> AutoRecord:
        data: AutoRecord = {
            "method": self.method, "candidates": [c.to_dict() for c in self.candidates],
            "chosen": self.chosen.to_dict() if self.chosen else None, "skipped": self.skipped,
            "larger": self.larger, "out": self.out, "report": self.report}
        if self.load is not None:  # measured: --load's levels, the preference, the original
            data["load"], data["prefer"] = self.load, self.prefer
            data["reference"] = self.reference
        return data
