"""`quantkit run` cut off and run again: the 8B recipe's shape (chat calibration mixed with a domain
source, GPTQ W4 g128 act-order, MMLU + HumanEval + domain + sampling, a serve section) on a tiny
8-layer model, killed once half way through quantization, finished up to quantization with
`--until quantize`, and killed once between validation tasks. Each rerun recomputes nothing that
was finished: the files' identities say so, not timings."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml


@pytest.fixture(scope="module")
def deep_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with 8 layers of hidden 256 (group size 128 divides every input), so a
    run can be killed half way."""
    from _models import save_random
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("deep")
    cfg = LlamaConfig.from_pretrained(tiny_model)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 8, 256, 512
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, 64
    save_random(cfg, path, tiny_model, seed=1)
    return path


def _mmlu_two_subjects(root: Path) -> Path:
    """Two subjects of the MMLU shipped with quantkit as a --mmlu-data folder (57 would make
    lm-eval build 57 tasks for each of the three runs)."""
    from importlib import resources

    for split in ("test", "dev"):
        raw = resources.files("quantkit").joinpath("data", "mmlu", f"{split}.jsonl.gz").read_bytes()
        rows = [json.loads(ln) for ln in gzip.decompress(raw).decode().split("\n") if ln]
        for subject in ("astronomy", "virology"):
            mine = [r for r in rows if r["subject"] == subject][:5]
            (root / split).mkdir(parents=True, exist_ok=True)
            (root / split / f"{subject}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in mine))
    return root


def _recipe(tmp: Path, model: Path, corpus: dict[str, Path]) -> Path:
    domain = tmp / "domain.jsonl"
    texts = [" ".join(p.split()) for p in corpus["prose"].read_text().split("\n\n")[:12]]
    domain.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts if t)
                      + json.dumps({"prompt": "Name a Python module.", "answer": "os",
                                    "match": "contains"}) + "\n")
    recipe = {
        "version": 1, "name": "resume", "model": str(model),
        "calibration": {"sources": [f"{corpus['chats']}@0.7", f"{corpus['prose']}@0.3"],
                        "samples": 16, "min_tokens": 64, "max_tokens": 128},
        "quantize": {"method": "gptq", "bits": 4, "group_size": 128, "act_order": True,
                     "device": "cpu"},
        "validate": {"tasks": ["mmlu", "humaneval", "domain", "sampling"],
                     "mmlu_data": str(_mmlu_two_subjects(tmp / "mmlu")), "humaneval_limit": 2,
                     "humaneval_max_tokens": 16, "domain_set": str(domain), "samples": 4,
                     "max_tokens": 16,
                     "thresholds": {"mmlu": {"retention": 0.5},
                                    "domain": {"ppl_increase": 5.0}}},
        "serve": {"engine": "transformers", "max_num_seqs": 4},
        "outputs": {"calib": str(tmp / "calib"), "artifact": str(tmp / "artifact"),
                    "report": str(tmp / "report")}}
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _identity(path: Path) -> tuple[int, int, str]:
    """A file's inode, modification time and content: rewritten or not."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def _run_until(args: list[str], env: dict[str, str], cwd: Path, done: Any, what: str) -> None:
    """Start `quantkit run` and kill its process group (as preemption does) once `done()`."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    hit = False
    while time.time() < deadline and proc.poll() is None:
        if done():
            os.killpg(proc.pid, signal.SIGKILL)
            hit = True
            break
        time.sleep(0.02)
    proc.wait()
    assert hit, f"the run must be killed {what} for this test to mean anything"


@pytest.mark.slow  # five `quantkit run` processes of an 8-layer model (~2.5 min on 2 cores)
def test_run_killed_twice_resumes_without_recomputing(deep_model: Path, corpus: dict[str, Path],
                                                      tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, deep_model, corpus)
    env = {**os.environ, "QUANTKIT_HOME": str(tmp_path / "home")}
    args = [sys.executable, "-m", "quantkit", "run", str(recipe)]
    samples = tmp_path / "calib" / "samples.jsonl"
    state = tmp_path / ".artifact.partial" / "resume.json"

    def layers_done() -> int:
        try:
            return int(json.loads(state.read_text())["layers_done"])
        except (OSError, ValueError, KeyError):
            return 0

    # 1: killed with 2-7 of 8 layers quantized
    _run_until(args, env, tmp_path, lambda: layers_done() >= 2, "half way through quantization")
    killed_at = layers_done()
    assert 2 <= killed_at < 8 and not (tmp_path / "artifact").exists()
    calib_id = _identity(samples)

    # 2: `--until quantize` resumes quantization from its finished layers and stops there
    until = subprocess.run(args + ["--until", "quantize"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert until.returncode == 0, until.stderr[-3000:]
    assert "calibrate: reusing" in until.stderr and "quantize: running" in until.stderr
    assert f"stopped after quantize; next: quantkit run {recipe}" in until.stdout
    manifest = tmp_path / "artifact" / "quantkit.json"
    art_id = _identity(manifest)
    assert not (tmp_path / "report").exists() and not (tmp_path / ".report.partial").exists()

    # 3: validation starts from the kept artifact; killed after its first task
    finished = tmp_path / ".report.partial"
    _run_until(args, env, tmp_path, lambda: (finished / "mmlu.json").is_file(),
               "between validation tasks")
    assert _identity(samples) == calib_id  # the calibration set was reused, not rewritten
    assert _identity(manifest) == art_id
    kept = json.loads((finished / "mmlu.json").read_text())
    assert not (tmp_path / "report").exists()

    # 4: finishes; MMLU is the kept result, the rest is computed
    res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    assert "calibrate: reusing" in res.stderr and "quantize: reusing" in res.stderr
    assert "task mmlu: reusing its result from the interrupted validation" in res.stderr
    assert _identity(samples) == calib_id and _identity(manifest) == art_id
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["tasks"]["mmlu"] == kept["result"]
    assert set(results["tasks"]) == {"mmlu", "humaneval", "domain", "sampling"}
    assert not finished.exists()  # a finished validation leaves no partial results behind
    # the phase table: every step with its wall time and peak memory, in run.json and the report
    phases = json.loads((tmp_path / "report" / "run.json").read_text())["steps"]
    assert list(phases) == ["calibrate", "quantize", "validate", "report"]
    assert phases["calibrate"]["reused"] and phases["quantize"]["reused"]
    assert not phases["validate"]["reused"] and phases["validate"]["seconds"] > 0
    assert all(p["peak_rss_gib"] > 0 and p["peak_gpu_gib"] is None for p in phases.values())
    for name in ("humaneval", "domain", "sampling"):
        assert results["tasks"][name]["resources"]["peak_rss_gib"] > 0
    assert "Run phases (quantkit run)" in (tmp_path / "report" / "report.html").read_text()
    # the manifest keeps the layer-by-layer timings of the run that finished the quantization
    assert json.loads(manifest.read_text())["timings"]

    # 5: nothing left to do: every step reused, results.json untouched
    res_id = _identity(tmp_path / "report" / "results.json")
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == res.returncode, again.stderr[-3000:]
    assert "validate: reusing" in again.stderr
    assert _identity(tmp_path / "report" / "results.json") == res_id
    assert _identity(samples) == calib_id and _identity(manifest) == art_id


def test_a_step_that_breaks_is_named_with_what_is_kept() -> None:
    """An unexpected failure inside a step (CUDA out of memory in the middle of validation, an
    engine's crash) is exit 3 naming the step, the task where it was one, and how to resume."""
    from quantkit.errors import EXIT_ENGINE, EngineError
    from quantkit.run import step_failed

    oom = RuntimeError("CUDA out of memory. Tried to allocate 896.00 MiB.")
    err = step_failed("validate", Path("r.yaml"), EngineError(f"task humaneval: {oom}"))
    assert err.exit_code == EXIT_ENGINE
    assert err.message.startswith("the validate step failed: task humaneval: CUDA out of memory")
    assert "`quantkit run r.yaml` again resumes there" in err.hint
    assert "free the GPU" in err.hint
    crash = step_failed("quantize", Path("r.yaml"), ValueError("bad\n  shape"))
    assert crash.message == "the quantize step failed: ValueError: bad shape"
    assert "out of memory" not in crash.hint


def test_until_names_a_step_of_the_recipe(tiny_model: Path, corpus: dict[str, Path],
                                          tmp_path: Path, cli: Any) -> None:
    """`--until` a step the recipe does not have is bad input before any work."""
    recipe = _recipe(tmp_path, tiny_model, corpus)
    code, _, err = cli("run", str(recipe), "--until", "report")
    assert code == 2
    assert "has no step 'report'" in err and "calibrate or quantize or validate" in err
    assert not (tmp_path / "calib").exists()


def test_until_a_step_before_validation_needs_no_serving_engine(
        tiny_model: Path, corpus: dict[str, Path], tmp_path: Path, cli: Any) -> None:
    """A recipe that serves on vLLM is refused before any work on a machine without vLLM, unless
    the run stops before validation (`--until calibrate|quantize`: the quantizing machine)."""
    recipe = _recipe(tmp_path, tiny_model, corpus)
    r = yaml.safe_load(recipe.read_text())
    r["serve"] = {"engine": "vllm"}
    recipe.write_text(yaml.safe_dump(r))
    code, _, err = cli("run", str(recipe))
    assert code == 2, err
    assert "vllm" in err.lower() and "hint:" in err
    assert not (tmp_path / "calib").exists()
    code, out, err = cli("run", str(recipe), "--until", "calibrate")
    assert code == 0, err
    assert f"stopped after calibrate; next: quantkit run {recipe}" in out
    assert (tmp_path / "calib").is_dir()
