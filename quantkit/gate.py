"""The gate: thresholds (strict YAML) -> checks -> verdict, and junit.xml for CI systems. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from quantkit.contract import GateCheck, GateDecision, TaskResult
from quantkit.errors import BadInput
from quantkit.task_registry import TASKS, metrics

CAUSES = ["the calibration set does not match the domain (check its match to the domain set; "
          "rebuild it from domain text with the model's chat template)",
          "the method (try AWQ instead of GPTQ or the reverse, act-order, a smaller group size)",
          "the bits (4-bit is too few for this model: try 8-bit or a larger k-quant)"]


@dataclass(frozen=True, eq=False)
class Thresholds(Mapping[str, dict[str, float]]):
    """Checked limits, task -> metric -> limit: each task's own metrics only (an lm-eval task's:
    retention), numbers in the metric's range. Parsed once, where a config is checked."""

    limits: dict[str, dict[str, float]] = field(default_factory=dict)

    def __getitem__(self, task: str) -> dict[str, float]:
        return self.limits[task]

    def __iter__(self) -> Iterator[str]:
        return iter(self.limits)

    def __len__(self) -> int:
        return len(self.limits)

    @classmethod
    def parse(cls, data: Any, where: str = "thresholds") -> Thresholds:
        """`data` (a YAML mapping) checked into Thresholds, or BadInput naming what is wrong."""
        if not isinstance(data, Mapping):
            raise BadInput(f"{where}: expected a mapping of task to limits",
                           "e.g. mmlu: {retention: 0.97}")
        out: dict[str, dict[str, float]] = {}
        for task, limits in data.items():
            if not isinstance(task, str):
                raise BadInput(f"{where}: task {task!r} is not a name", "use " + ", ".join(TASKS))
            known = metrics(task)  # ours, or an lm-eval task's retention
            if not isinstance(limits, Mapping) or not limits:
                raise BadInput(f"{where}: {task} needs a mapping of metric to limit",
                               f"e.g. {task}: {{{next(iter(known))}: ...}}")
            for metric, limit in limits.items():
                if metric not in known:
                    raise BadInput(f"{where}: unknown metric {task}.{metric}",
                                   f"{task} knows " + ", ".join(known))
                lo, hi = known[metric].lo, known[metric].hi
                if (isinstance(limit, bool) or not isinstance(limit, (int, float))
                        or not lo <= limit <= hi):
                    raise BadInput(f"{where}: {task}.{metric} = {limit!r} is out of range",
                                   f"use a number from {lo} to {hi}")
                out.setdefault(task, {})[metric] = float(limit)
        return cls(out)


def read_thresholds(path: Path) -> dict[str, Any]:
    """A thresholds YAML file as its mapping (checked by Thresholds.parse where the config is)."""
    import yaml

    from quantkit.fsutil import read_text

    text = read_text(Path(path), "thresholds file", "check the --thresholds path")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"thresholds file {path} is not valid YAML ({exc})".splitlines()[0],
                       "fix the YAML syntax") from exc
    if not data:  # an empty file must not silently turn the gate off
        raise BadInput(f"thresholds file {path} is empty: it would gate nothing",
                       "name at least one limit, e.g. mmlu: {retention: 0.97}; or leave "
                       "--thresholds out for an ungated run")
    if not isinstance(data, dict):
        raise BadInput(f"thresholds {path}: expected a mapping of task to limits",
                       "e.g. mmlu: {retention: 0.97}")
    return data


def load_thresholds(path: Path) -> Thresholds:
    """A thresholds file, read and checked."""
    return Thresholds.parse(read_thresholds(path), f"thresholds {path}")


def decide(tasks: Mapping[str, Any], thresholds: Mapping[str, Mapping[str, float]]
           ) -> GateDecision:
    """Each threshold against its measured value and interval (`tasks`: each task's result, as
    results.json holds it or as a TaskResult); the verdict."""
    checks = []
    for task, limits in thresholds.items():
        got = tasks.get(task)
        result = got if isinstance(got, TaskResult) else TaskResult.from_dict(got or {})
        for metric, limit in limits.items():
            op = metrics(task)[metric].op
            m = result.metric(metric)
            if m is None:
                checks.append(GateCheck(task, metric, op, limit, note="not measured (the task or "
                                        "its data did not produce it)"))
                continue
            ok = not math.isnan(m.value) and (m.value >= limit if op == ">=" else m.value <= limit)
            small = (m.lo is not None and m.hi is not None
                     and too_small(m.n or 0, m.lo, m.hi, limit, op))
            checks.append(GateCheck(task, metric, op, limit, m.value, m.lo, m.hi, m.n,
                                    passed=bool(ok), too_small=bool(small),
                                    note=m.note or None))  # "no signal: ..."
    failing = [c.name for c in checks if not c.passed]
    verdict = "not gated" if not checks else ("fail" if failing else "pass")
    return GateDecision(verdict, checks, failing, causes(checks))


def causes(checks: list[GateCheck]) -> list[str]:
    """Why the failing checks failed, most likely first: the usual causes where the quantized
    model measured worse; for a check that measured nothing (no value, or no signal because the
    original scores 0 as well) that measurement, whose fix is in the task, not the quantization."""
    failing = [c for c in checks if not c.passed]
    out = list(CAUSES) if any(not c.unmeasured for c in failing) else []
    return out + [unmeasured_cause(c) for c in failing if c.unmeasured]


def unmeasured_cause(c: GateCheck) -> str:
    """What a check that measured nothing needs (GateCheck.unmeasured)."""
    if not c.no_signal:
        return (f"{c.name} was not measured: the task or its data did not produce it (a domain "
                f"set without QA lines gives no qa_retention); give the task its data, or take "
                f"{c.name} out of the thresholds")
    return (f"{c.name} has no signal ({(c.note or '').removeprefix('no signal: ')}): "
            f"the original model scores 0 on {c.task}, so it cannot tell what quantization kept; "
            f"check the original on {c.task} (the prompt format, max_tokens, a base model given "
            f"an instruction task) or take {c.name} out of the thresholds")


def write_junit(gate: GateDecision, path: Path) -> None:
    """One test case per threshold."""
    suite = ET.Element("testsuite", name="quantkit.validate", tests=str(len(gate.checks)),
                       failures=str(len(gate.failing)))
    for c in gate.checks:
        case = ET.SubElement(suite, "testcase", classname=f"quantkit.{c.task}", name=c.metric)
        text = (f"{c.name} = {_fmt(c.value)} [{_fmt(c.lo)}, {_fmt(c.hi)}], "
                f"limit {c.op} {c.limit}")
        if c.too_small:
            text += "; the sample is too small to support this verdict"
        if not c.passed:
            ET.SubElement(case, "failure", message=text).text = c.note or text
        else:
            ET.SubElement(case, "system-out").text = text
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def too_small(n: int, lo: float, hi: float, limit: float, op: str) -> bool:
    """True when the interval [lo, hi] cannot support a verdict on `value op limit` either way.

    For ">=" the check passes when lo >= limit and fails when hi < limit; for "<=" it passes
    when hi <= limit and fails when lo > limit. Anything in between straddles the threshold.
    An empty sample or a nan bound is always too small.
    """
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', got {op!r}")
    if n <= 0 or math.isnan(lo) or math.isnan(hi):
        return True
    if op == ">=":
        return lo < limit <= hi
    return lo <= limit < hi
