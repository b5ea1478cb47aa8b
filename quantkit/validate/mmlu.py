"""MMLU through lm-evaluation-harness: its own 5-shot `mmlu_*` task definitions and loglikelihood
scoring, run on a quantkit `Engine` through a small lm-eval model adapter."""

from __future__ import annotations

import difflib
import functools
import gzip
import json
import logging
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict

from quantkit.engines import Engine
from quantkit.errors import BadInput
from quantkit.validate.lmeval import Encoded, Progress, evaluate_docs, offline_datasets

HUB_DATASET = "cais/mmlu"
BUNDLED = "quantkit/data/mmlu"  # the complete release (dev + test) shipped in the package
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the hub spells it


def __getattr__(name: str) -> Any:
    # `from quantkit.validate.mmlu import QuantkitLM` works, yet lm_eval loads only when asked
    if name == "QuantkitLM":
        from quantkit.validate.lmeval import adapter_class

        return adapter_class()
    raise AttributeError(name)


def _lm_eval_mmlu_dir(variant: str = "default") -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "mmlu" / variant


def hub_id(data: Path | str | None) -> str | None:
    """`data` as a hub dataset id (owner/name) when it names no local path, else None."""
    if data is None or Path(data).exists():
        return None
    text = str(data)
    return text if _HUB_ID.fullmatch(text) and not text.startswith(".") else None


class MMLURow(TypedDict):
    """One question of the shipped MMLU."""

    question: str
    subject: str
    choices: list[str]
    answer: int


class SubjectScore(TypedDict):
    accuracy: float
    n: int


class MMLUSide(TypedDict):
    """One model's MMLU (`run_mmlu`): accuracy, and each question's outcome in a stable order
    (`ids` beside `correct`) so two models' runs pair up."""

    accuracy: float
    n: int
    correct: list[int]
    ids: list[str]
    subjects: dict[str, SubjectScore]
    num_fewshot: int
    seconds: dict[str, float]  # load, and lm-eval's phases
    source: str


@functools.cache
def bundled_rows(split: str) -> dict[str, list[MMLURow]]:
    """The shipped MMLU `split` (test or dev) by subject, rows in release order; each file is
    read once a process."""
    raw = resources.files("quantkit").joinpath("data", "mmlu", f"{split}.jsonl.gz").read_bytes()
    by_subject: dict[str, list[MMLURow]] = {}
    # split at "\n" only: questions hold U+2028 and the like, where str.splitlines() cuts too
    for line in gzip.decompress(raw).decode("utf-8").split("\n"):
        if line:
            row = json.loads(line)
            by_subject.setdefault(row["subject"], []).append(row)
    return by_subject


def _bundled_dataset(subject: str, **_metadata: Any) -> dict[str, Any]:
    """lm-eval's `custom_dataset` hook: one subject's test and dev splits from the package."""
    from datasets import Dataset

    return {split: Dataset.from_list(bundled_rows(split)[subject]) for split in ("test", "dev")}


def _no_custom_kwargs_tip(record: logging.LogRecord) -> bool:
    # lm-eval's tip about `--metadata` for tasks with a custom_dataset, which is not ours to take
    return "Custom kwargs can be passed" not in record.getMessage()


def task_config(subject: str, data_dir: Path | str | None, num_fewshot: int,
                variant: str = "default") -> dict[str, Any]:
    """lm-eval's own `mmlu_SUBJECT` config (its YAML with `include` resolved), its data taken
    from the MMLU shipped in the package (`data_dir` None), a folder of {test,dev}/SUBJECT.jsonl,
    or a hub dataset id such as cais/mmlu. `variant` is lm-eval's folder: default
    (loglikelihood) or generative (generate_until, for servers without prompt logprobs)."""
    import yaml

    root = _lm_eval_mmlu_dir(variant)
    cfg = yaml.safe_load((root / f"mmlu_{subject}.yaml").read_text())
    base = yaml.safe_load((root / cfg.pop("include")).read_text())
    cfg = {**base, **cfg, "num_fewshot": num_fewshot}
    if data_dir is None:
        cfg.update(dataset_path=BUNDLED, dataset_name=None, custom_dataset=_bundled_dataset,
                   dataset_kwargs={"subject": subject})
    elif (hub := hub_id(data_dir)) is not None:
        cfg.update(dataset_path=hub)  # the hub's per-subject configs, as lm-eval's own YAML
    else:
        data_dir = Path(data_dir)
        cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": {
            "test": str(data_dir / "test" / f"{subject}.jsonl"),
            "dev": str(data_dir / "dev" / f"{subject}.jsonl")}})
    return cfg


def _pick_subjects(data_dir: Path | str | None, subjects: list[str] | None) -> list[str]:
    """The subjects to run, sorted; unknown names raise BadInput with the closest match."""
    known = sorted(p.stem.removeprefix("mmlu_") for p in _lm_eval_mmlu_dir().glob("mmlu_*.yaml"))
    if data_dir is None:
        try:
            have = set(bundled_rows("test")) & set(bundled_rows("dev"))
        except (OSError, ValueError, KeyError) as exc:  # missing, truncated or not our rows
            raise BadInput(f"the MMLU data shipped with quantkit ({BUNDLED}) is unreadable: "
                           f"{exc}", "reinstall quantkit, or pass --mmlu-data DIR with "
                           "{test,dev}/SUBJECT.jsonl") from exc
        known = [s for s in known if s in have]
    elif hub_id(data_dir) is None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise BadInput(f"MMLU data folder not found: {data_dir}",
                           "pass --mmlu-data DIR with {test,dev}/SUBJECT.jsonl or a hub dataset "
                           f"such as {HUB_DATASET}, or leave it out for the MMLU shipped with "
                           "quantkit")
        have = {p.stem for p in (data_dir / "test").glob("*.jsonl") if p.stat().st_size > 0}
        have &= {p.stem for p in (data_dir / "dev").glob("*.jsonl") if p.stat().st_size > 0}
        if not have:
            raise BadInput(f"no MMLU data in {data_dir}: expected test/SUBJECT.jsonl and "
                           "dev/SUBJECT.jsonl",
                           "one {question, subject, choices[4], answer 0-3} a line, as cais/mmlu; "
                           "or leave --mmlu-data out for the MMLU shipped with quantkit")
        known = [s for s in known if s in have]
    for s in subjects or []:
        if s not in known:
            close = difflib.get_close_matches(s, known, n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadInput(f"unknown MMLU subject {s!r}{guess}",
                           f"subjects available: {', '.join(known)}")
    return sorted(set(subjects)) if subjects else known


def run_mmlu(engine: Engine, *, data_dir: Path | str | None, limit: int | None = None,
             subjects: list[str] | None = None, num_fewshot: int = 5,
             progress: Progress | None = None, encoded: Encoded | None = None) -> MMLUSide:
    """Accuracy of `engine` on MMLU with lm-eval's prompts and scoring; `limit` is per subject.
    `data_dir`: None for the MMLU shipped in the package, a folder of {test,dev}/SUBJECT.jsonl,
    or a hub dataset id (cais/mmlu) loaded through `datasets`.

    `correct` and `ids` list every question in one stable order (subject, then question index),
    so two models' runs pair up for a bootstrap. `encoded`: token ids shared with another
    engine of the same tokenizer (lmeval.evaluate_docs)."""
    if (limit is not None and limit < 1) or num_fewshot < 0:
        raise BadInput(f"bad MMLU options: limit={limit}, num_fewshot={num_fewshot}",
                       "limit counts questions per subject (1 or more); num_fewshot is 0-5")
    start = time.perf_counter()
    hub = hub_id(data_dir)
    if hub is None:
        data_dir = Path(data_dir) if data_dir is not None else None
        offline_datasets()
    chosen = _pick_subjects(data_dir, subjects)
    from datasets.exceptions import DatasetGenerationError
    from lm_eval.tasks import TaskManager

    configs = [task_config(s, data_dir, num_fewshot) for s in chosen]
    task_log = logging.getLogger("lm_eval.api.task")
    task_log.addFilter(_no_custom_kwargs_tip)  # said once per subject for custom_dataset
    try:
        loaded = TaskManager(include_defaults=False).load(configs)
    except (OSError, ValueError, DatasetGenerationError) as exc:  # not found, offline, malformed
        if hub is not None:
            raise BadInput(f"MMLU data {hub} not found (offline, or not on the hub): {exc}",
                           "go online for the hub, pass --mmlu-data DIR with "
                           "{test,dev}/SUBJECT.jsonl, or leave --mmlu-data out for the MMLU "
                           "shipped with quantkit") from exc
        where = data_dir if data_dir is not None else BUNDLED
        raise BadInput(f"cannot read MMLU data in {where}: {exc}",
                       "each line must be {question, subject, choices[4], answer 0-3}") from exc
    finally:
        task_log.removeFilter(_no_custom_kwargs_tip)
    seconds = {"load": round(time.perf_counter() - start, 2)}
    samples = evaluate_docs(engine, loaded, limit=limit, progress=progress, label="mmlu",
                            seconds=seconds, encoded=encoded)
    ids: list[str] = []
    correct: list[int] = []
    per_subject: dict[str, SubjectScore] = {}
    for subject in chosen:
        docs = samples[f"mmlu_{subject}"]
        hits = [int(round(d["acc"])) for d in docs]
        ids += [f"{subject}/{d['doc_id']}" for d in docs]
        correct += hits
        per_subject[subject] = {"accuracy": sum(hits) / len(hits) if hits else 0.0, "n": len(hits)}
    return {"accuracy": sum(correct) / len(correct) if correct else 0.0, "n": len(correct),
            "correct": correct, "ids": ids, "subjects": per_subject, "num_fewshot": num_fewshot,
            "seconds": seconds,
            "source": f"hub:{hub}" if hub is not None
            else f"local:{data_dir}" if data_dir is not None else f"bundled:{BUNDLED}"}
