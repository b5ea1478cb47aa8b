"""Validated artifacts for the card and publish tests, cheap: the tiny GPTQ artifact (conftest's
`tiny_artifact`) validated on the domain and sampling tasks (about 2 s), once passing and once
failing its gate; and a GGUF artifact folder written by hand (a real GGUF file from the gguf
library, a manifest, and a validation naming the file's sha256), since llama.cpp's converter
needs a tokenizer it knows (tests/quantize/test_gguf.py, slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from quantkit.contract import ArtifactRecord, TaskResult
from quantkit.results import Results

DOMAIN = [{"text": "def add(a, b):\n    return a + b\n"},
          {"text": "The json module parses JSON text into Python objects."},
          {"prompt": "Which keyword defines a function?", "answer": "def"}]
PASSING = {"domain": {"kld": 5.0, "ppl_increase": 5.0}, "sampling": {"flagged_increase": 1.0}}
FAILING = {"domain": {"kld": 0.0, "ppl_increase": 5.0}}  # any quantization moves the KL above 0


def validate_tiny(artifact: Path, model: Path, work: Path) -> dict[str, Path]:
    """`artifact` validated twice against `model`: reports/pass (the gate passed) and
    reports/fail (it failed on domain.kld)."""
    from quantkit.config import ValidateConfig
    from quantkit.validate import validate

    domain = work / "domain.jsonl"
    domain.write_text("".join(json.dumps(r) + "\n" for r in DOMAIN))
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTKIT_HOME", str(work / "home"))  # a baseline cache of our own
        mp.setenv("HF_HUB_OFFLINE", "1")
        for name, limits in (("pass", PASSING), ("fail", FAILING)):
            out[name] = work / "reports" / name
            validate(artifact=artifact, baseline=str(model), out=out[name], cfg=ValidateConfig(
                tasks=("domain", "sampling"), domain_set=str(domain), samples=2, max_tokens=8,
                thresholds=limits))
    return out


def tiny_gguf(work: Path, results_from: Path) -> dict[str, Path]:
    """A GGUF artifact (model-Q4_K_M.gguf with an importance matrix) whose source is a Hub model
    with a license in its card, and a passing validation of it in work/reports/gguf."""
    import gguf
    import numpy as np

    from quantkit.artifact import Manifest, Source
    from quantkit.fsutil import sha256_file

    source = work / "hub-snapshot"
    source.mkdir(parents=True)
    (source / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# Tiny\n")
    art = work / "artifacts" / "tiny-gguf"
    art.mkdir(parents=True)
    for name in ("model-Q4_K_M.gguf", "imatrix.gguf"):
        w = gguf.GGUFWriter(art / name, "llama")
        w.add_block_count(1)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    (art / "stray.txt").write_text("not part of the artifact")
    manifest = Manifest(
        checkpoint="gguf", method="gguf", file="model-Q4_K_M.gguf",
        source=Source(spec="acme/tiny-instruct", path=str(source), weights_sha256="0" * 64,
                      architecture="LlamaForCausalLM", parameters=205120,
                      model_sha256="1" * 64),
        calibration={"path": "calib_sets/tiny", "samples_sha256": "2" * 64, "samples": 8},
        parameters={"quant_type": "Q4_K_M", "imatrix": True, "threads": 2},
        versions={"quantkit": "0.1.0", "llama-cpp-python": "0.3.36"}, wall_time_s=3.5,
        size_bytes={"before": 822632, "after": 300000}, bits_per_weight=5.6,
        imatrix={"file": "imatrix.gguf", "entries": 14, "tokens": 2048},
        tensor_types={"Q4_K": 10, "Q6_K": 2}, tensors=12, fallback_tensors=0)
    manifest.write(art)
    res = Results.read(results_from)
    res = dataclasses.replace(res, engine="llama.cpp", engine_version="0.3.36",
                              artifact=ArtifactRecord(str(art),
                                                      sha256_file(art / "model-Q4_K_M.gguf"),
                                                      manifest.to_dict()))
    reports = work / "reports" / "gguf"
    reports.mkdir(parents=True)
    res.write(reports)
    return {"artifact": art, "results": reports}


def with_task(results: Path, out: Path, name: str, task: dict[str, Any]) -> Path:
    """A copy of the validation in `results` with one more task result (e.g. an lm-eval task)."""
    res = Results.read(results)
    out.mkdir(parents=True)
    dataclasses.replace(res, tasks={**res.tasks, name: TaskResult.from_dict(task)}).write(out)
    return out
