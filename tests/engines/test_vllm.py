"""The vLLM engine: validation on the serving engine. On CPU machines `--engine vllm` is a clear
error; the tests marked gpu run where vLLM and a GPU exist (bench/h200/gpu_tests.sh)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from quantkit.engines.vllm import vllm_available
from quantkit.gpu import gpu_present

HAVE_VLLM = vllm_available() is not None and gpu_present()
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="needs an NVIDIA GPU and vLLM")


@pytest.mark.skipif(HAVE_VLLM, reason="this machine can run vLLM")
def test_engine_vllm_without_gpu_is_bad_input(tmp_path: Path, cli: Any,
                                              tiny_artifact: Path, tiny_model: Path) -> None:
    out = tmp_path / "report"
    code, _, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model),
                       "--engine", "vllm", "--tasks", "sampling", "--out", str(out))
    assert code == 2, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "--engine vllm needs an NVIDIA GPU and vLLM" in errors[0]
    assert [ln for ln in err.splitlines() if ln.startswith("hint:")]
    assert "Traceback" not in err and not out.exists()


def test_start_mode_reads_the_environment_and_refuses_an_unknown_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """$QUANTKIT_VLLM_START picks how validation's engines start (bench/h200/vllm_start.py
    measures each); a value vLLM has no options for is refused by name, with the ones it has."""
    from quantkit.engines.vllm import START_DEFAULT, START_MODES, start_mode
    from quantkit.errors import BadInput

    monkeypatch.delenv("QUANTKIT_VLLM_START", raising=False)
    assert start_mode() == START_DEFAULT
    for mode in START_MODES:
        monkeypatch.setenv("QUANTKIT_VLLM_START", mode)
        assert start_mode() == mode
    assert START_MODES["eager"] == {"enforce_eager": True}
    monkeypatch.setenv("QUANTKIT_VLLM_START", "fast")
    with pytest.raises(BadInput) as err:
        start_mode()
    assert "QUANTKIT_VLLM_START=fast" in str(err.value)
    assert all(m in str(err.value) for m in START_MODES)


def _closed_file() -> Any:
    import tempfile

    f = tempfile.TemporaryFile("w+")  # a file, as pytest's capture is (a closed StringIO's
    f.close()  # flush never fails)
    return f


@pytest.mark.parametrize("stream", ["stdout", "closed"])
def test_vllm_logs_go_to_stderr_so_json_stdout_stays_parseable(
        stream: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM logs to stdout by default (`auto --json` on a GPU printed its INFO lines before the
    JSON); a vLLM logger set up before quantkit's engine loads is moved to stderr too. `closed`:
    a second engine in one process, whose vLLM handler still holds the first caller's stderr,
    since closed (pytest's capture did this to every GPU test after the first): it moves too,
    instead of failing on a flush into the closed file."""
    import logging
    import os
    import sys

    from quantkit.engines.vllm import logs_to_stderr

    monkeypatch.delenv("VLLM_LOGGING_STREAM", raising=False)
    log = logging.getLogger("vllm")
    # stdout: what vLLM's own configuration makes
    handler = logging.StreamHandler(sys.stdout if stream == "stdout" else _closed_file())
    log.addHandler(handler)
    monkeypatch.setattr(log, "propagate", False)
    try:
        logs_to_stderr()
        log.warning("engine ready")
    finally:
        log.removeHandler(handler)
    got = capsys.readouterr()
    assert os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"  # for the engine-core process
    assert handler.stream is sys.stderr
    assert "engine ready" in got.err and got.out == ""


def test_engine_choice_follows_the_artifact() -> None:
    from quantkit.engines.choice import choose_engine
    from quantkit.errors import BadInput

    if find_spec("llama_cpp") is not None:
        assert choose_engine("gguf", "auto", "validate") == "llama.cpp"
    else:  # the gguf extra left out (CI's Python 3.12 tier): refused early, saying which package
        with pytest.raises(BadInput, match="llama-cpp-python"):
            choose_engine("gguf", "auto", "validate")
    assert choose_engine("compressed-tensors", "transformers", "validate") == "transformers"
    assert choose_engine("compressed-tensors", "auto", "validate") == (
        "vllm" if HAVE_VLLM else "transformers")
    with pytest.raises(BadInput, match="cannot run a GGUF"):
        choose_engine("gguf", "vllm", "validate")
    with pytest.raises(BadInput, match=r"cannot run a compressed-tensors artifact \(it runs GGUF"):
        choose_engine("compressed-tensors", "llama.cpp", "validate")


@pytest.fixture(scope="module")
def vllm_artifact(tiny_model: Path, corpus: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, Path]:
    """(model, GPTQ W4 g128 artifact) shaped for vLLM's Marlin/Machete kernels (hidden 256, MLP
    512), with the tiny model's tokenizer; quantized on the GPU."""
    import torch
    from _models import random_llama

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.quantize import quantize

    root = tmp_path_factory.mktemp("vllm-artifact")
    model = root / "model"
    random_llama(model, tiny_model, dtype=torch.bfloat16, vocab_size=1024, hidden_size=256,
                 intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
                 eos_token_id=2, torch_dtype="bfloat16")
    calibrate(model=str(model), out=root / "calib", cfg=CalibrateConfig(
        sources=(str(corpus["prose"]), str(corpus["code"])), samples=16, min_tokens=128,
        max_tokens=128))
    quantize(model=str(model), cfg=QuantizeConfig(method="gptq", group_size=128, device="cuda"),
             calib=root / "calib", out=root / "artifact")
    return model, root / "artifact"


@pytest.mark.gpu
@needs_vllm
def test_vllm_and_transformers_agree_on_an_artifact(vllm_artifact: tuple[Path, Path]) -> None:
    """The same artifact scored by vLLM and by transformers: the same greedy tokens, close
    log-probabilities, and seeded sampling that repeats."""
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine

    artifact = vllm_artifact[1]
    v = VllmEngine(artifact, max_context=512, gpu_memory_utilization=0.3)
    h = TransformersEngine(artifact, device="cuda", max_context=512)
    text = h.encode("def add(a, b):\n    return a + b\n" * 8)
    nh, nv = h.token_nlls(text), v.token_nlls(text)
    assert len(nh) == len(nv)
    assert abs(sum(nh) / len(nh) - sum(nv) / len(nv)) < 0.05
    reqs = [(h.encode("def add(a, b):"), h.encode("\n    return"))]
    assert abs(h.loglikelihood(reqs)[0][0] - v.loglikelihood(reqs)[0][0]) < 0.1
    # longer than the context: vLLM wants room for one output token past a prompt, so a window
    # of exactly max_model_len tokens is refused (what MMLU's 5-shot prompts hit on the device)
    long = text * 6
    assert len(long) > 512
    nh, nv = h.token_nlls(long), v.token_nlls(long)
    assert len(nh) == len(nv) and abs(sum(nh) / len(nh) - sum(nv) / len(nv)) < 0.1
    assert v.loglikelihood([(long, h.encode("\n    return"))])[0][0] < 0
    a = v.generate_many(["x = 1\n"] * 3, max_tokens=8, temperature=0.9, top_p=0.9, seed=3)
    b = v.generate_many(["x = 1\n"] * 3, max_tokens=8, temperature=0.9, top_p=0.9, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    v.close()
    h.close()


@pytest.mark.gpu
@needs_vllm
def test_single_token_answers_score_as_prompt_logprobs_do(vllm_artifact: tuple[Path, Path]
                                                           ) -> None:
    """MMLU's four one-token answers after one prompt go through `logprob_token_ids` (one request
    per question, the few-shot prefix from vLLM's prefix cache): the same log-probabilities and
    greedy flags as vLLM's prompt logprobs and as transformers give, questions mixed in one call
    with a two-token continuation."""
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine

    artifact = vllm_artifact[1]
    v = VllmEngine(artifact, max_context=512, gpu_memory_utilization=0.3)
    h = TransformersEngine(artifact, device="cuda", max_context=512)
    shots = h.encode("Question: 2 + 2?\nA. 3\nB. 4\nAnswer: B\n\n" * 5)
    reqs = [(shots + h.encode(f"Question: {q}?\nAnswer:"), h.encode(f" {c}"))
            for q in ("1 + 1", "3 * 3", "def f(x)") for c in "ABCD"]
    assert all(len(cont) == 1 for _, cont in reqs)
    reqs.append((shots, h.encode(" return x")))
    fast = v.loglikelihood(reqs)
    seqs = [(v.prefix + ctx + cont)[-(v.context_length - 1):] for ctx, cont in reqs]
    slow = [lps[-1][s[-1]] for s, lps in zip(seqs, v._prompt_logprobs(seqs))]
    ref = h.loglikelihood(reqs)
    for (lp, greedy), s, (lp_h, _) in zip(fast[:-1], slow, ref):
        assert abs(lp - s.logprob) < 0.02 and greedy == (s.rank == 1)
        assert abs(lp - lp_h) < 0.1
    assert abs(fast[-1][0] - ref[-1][0]) < 0.1
    v.close()
    h.close()


@pytest.mark.gpu
@needs_vllm
def test_validate_on_vllm_names_the_engine(vllm_artifact: tuple[Path, Path], corpus: dict[str, Path],
                                           cli: Any, tmp_path: Path) -> None:
    """`quantkit validate --engine vllm`: baseline and artifact both on vLLM, the engine and its
    version in results.json, the domain and sampling tasks scored."""
    import json

    model, artifact = vllm_artifact
    domain = tmp_path / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f.read_text()[:1500]}) + "\n"
                              for f in sorted(corpus["code"].iterdir())[:8]))
    out = tmp_path / "report"
    code, _, err = cli("validate", str(artifact), "--baseline", str(model), "--engine", "vllm",
                       "--tasks", "domain,sampling", "--domain-set", str(domain), "--samples", "4",
                       "--max-tokens", "16", "--out", str(out))
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["engine"] == "vllm" and res["engine_version"]
    assert res["tasks"]["domain"]["baseline"]["ppl"] > 0 and res["tasks"]["sampling"]
    # the KL task runs on vLLM too, from each position's top k (how, named in the results)
    dom = res["tasks"]["domain"]
    assert dom["kld"]["value"] >= 0 and 0 <= dom["top1_agreement"]["value"] <= 1
    assert "top k" in dom["kld_rows"] and dom["uncovered_mass"]["max"] == 0


@pytest.mark.gpu
@needs_vllm
def test_kl_on_vllm_estimates_the_transformers_kl(vllm_artifact: tuple[Path, Path]) -> None:
    """The same pair scored by both engines: vLLM's top-k prompt logprobs, asked again with a
    larger k until the original's top-256 tokens are all found, give the KL and the top-1
    agreement that transformers' whole rows give."""
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine
    from quantkit.validate import kld

    model, artifact = vllm_artifact
    texts = ["def add(a, b):\n    return a + b\n" * 4, "for i in range(10):\n    print(i)\n" * 4]
    out = {}
    for name, make in (("hf", lambda p: TransformersEngine(p, device="cuda", max_context=512)),
                       ("vllm", lambda p: VllmEngine(p, max_context=512,
                                                     gpu_memory_utilization=0.2))):
        base = make(model)
        side = kld.baseline_side(base, texts)
        base.close()
        quant = make(artifact)
        out[name] = kld.compare(quant, texts, side).to_dict()
        quant.close()
    hf, vl = out["hf"], out["vllm"]
    assert vl["kld_positions"] == hf["kld_positions"]
    assert vl["uncovered_mass"]["max"] == 0    # every token of the original's top 256 was found
    # measured on the H200: 0.0006985 against 0.0006968 (the former even spread: 0.00245)
    assert vl["kld"]["value"] == pytest.approx(hf["kld"]["value"], rel=0.05, abs=1e-5)
    assert vl["top1_agreement"]["value"] == pytest.approx(hf["top1_agreement"]["value"], abs=0.05)


@pytest.mark.gpu
@needs_vllm
def test_vllm_serves_a_mixed_precision_artifact(vllm_artifact: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    """--w8-groups: two config groups (4 and 8 bits, regex targets naming vLLM's fused modules
    too); vLLM loads it and scores it as transformers does."""
    from quantkit.config import QuantizeConfig
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine
    from quantkit.quantize import quantize

    model, artifact = vllm_artifact
    calib = artifact.parent / "calib"
    mixed = tmp_path / "mixed"
    m = quantize(model=str(model), cfg=QuantizeConfig(method="gptq", group_size=128, device="cuda",
                                                      w8_groups="3"), calib=calib, out=mixed)
    assert m.sensitivity is not None and len(m.sensitivity["upgraded"]) == 3
    v = VllmEngine(mixed, max_context=512, gpu_memory_utilization=0.3)
    h = TransformersEngine(mixed, device="cuda", max_context=512)
    text = h.encode("def add(a, b):\n    return a + b\n" * 8)
    nh, nv = h.token_nlls(text), v.token_nlls(text)
    assert len(nh) == len(nv) and abs(sum(nh) / len(nh) - sum(nv) / len(nv)) < 0.05
    v.close()
    h.close()


@pytest.mark.gpu
@needs_vllm
def test_auto_load_measures_each_passing_candidate_on_vllm(
        vllm_artifact: tuple[Path, Path], corpus: dict[str, Path], tmp_path: Path, cli: Any) -> None:
    """`auto --load 1,4 --prefer speed`: every candidate that passes is served by vLLM and
    load-tested, the original too, one server at a time; each speed has its repeats and interval;
    the choice says whether the difference was measurable and OUT is the chosen one; the report
    plots accuracy by speed. (One start each and short levels, to fit a device call: the order's
    alternation over starts is tested on CPU, where it runs the same code.)"""
    import json

    from _serving import check_auto_speeds

    model, artifact = vllm_artifact
    domain = tmp_path / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f.read_text()[:600]}) + "\n"
                              for f in sorted(corpus["code"].iterdir())[:6]))
    thr = tmp_path / "t.yaml"
    thr.write_text("domain: {kld: 5.0}\n")  # random weights: every candidate passes
    code, out, err = cli("auto", str(model), "--calib", str(artifact.parent / "calib"),
                         "--candidates", "W4g128,W8", "--thresholds", str(thr), "--tasks",
                         "domain", "--domain-set", str(domain), "--load", "1,4", "--prefer",
                         "speed", "--restarts", "1", "--repeats", "2", "--min-seconds", "1",
                         "--requests", "4", "--warmup", "1", "--max-tokens", "16", "--out",
                         str(tmp_path / "art"), "--report", str(tmp_path / "rep"), "--json")
    assert code == 0, err[-3000:]
    res = json.loads(out)
    assert [c["verdict"] for c in res["candidates"]] == ["pass", "pass"]
    assert not [c["speed"]["error"] for c in res["candidates"] if "error" in c["speed"]], err[-3000:]
    assert {c["speed"]["engine"] for c in res["candidates"]} == {"vllm"}  # what production runs
    ref = res["reference"]
    assert ref["output_tok_s"] > 0 and res["load"] == [1, 4] and ref["starts"] == 1
    assert ref["order"] == ["original", "W4g128", "W8"]  # one server at a time on a GPU
    check_auto_speeds(res, "vllm", [1, 4], 2, smallest="W4g128")
    chosen = next(c for c in res["candidates"] if c["name"] == res["chosen"]["name"])
    assert json.loads((tmp_path / "art" / "quantkit.json").read_text())["parameters"]["bits"] == (
        chosen["bits"])
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "domain.kld against speed at concurrency 1,4" in html and "original " in html


def _kernel_scores(artifact: Path, kernel: str, prompt: str, max_tokens: int, seqs: int = 8
                   ) -> tuple[list[float], str]:
    """`quantkit serve --kernel KERNEL --max-num-seqs SEQS` on the artifact: the
    log-probabilities of the prompt's tokens (echo) and of `max_tokens` greedy ones, and the
    engine's log."""
    import json
    import sys
    import urllib.request

    from _serving import Served

    log = artifact.parent / f"engine-{artifact.name}-{kernel}-{seqs}.log"
    s = Served(str(artifact), "--allow-unvalidated", "--engine", "vllm", "--vllm-python",
               sys.executable, "--kernel", kernel, "--max-num-seqs", str(seqs),
               "--gpu-memory-utilization", "0.3", "--log-file", str(log), cwd=artifact.parent)
    try:
        body = json.dumps({"model": artifact.name, "prompt": prompt, "max_tokens": max_tokens,
                           "echo": True, "temperature": 0, "logprobs": 1}).encode()
        req = urllib.request.Request(s.url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            got = json.loads(r.read())
    finally:
        s.stop()
    scores = [v for v in got["choices"][0]["logprobs"]["token_logprobs"] if v is not None]
    return scores, log.read_text(errors="replace")


@pytest.mark.gpu
@needs_vllm
def test_dual_kernel_serves_as_marlin_does(vllm_artifact: tuple[Path, Path]) -> None:
    """`quantkit serve --kernel dual` (quantkit's vLLM plugin: Marlin for few tokens per step,
    Machete for many) loads, logs its kernel, and scores a completion as `--kernel marlin` does."""
    _, artifact = vllm_artifact
    prompt = "def add(a, b):\n    return a + b\n" * 20  # ~300 tokens: the prefill takes Machete
    dual, dual_log = _kernel_scores(artifact, "dual", prompt, 1)
    marlin, _ = _kernel_scores(artifact, "marlin", prompt, 1)
    assert "Using QuantkitDualLinearKernel for CompressedTensorsWNA16" in dual_log
    assert "quantkit dual kernel: K=" in dual_log  # each shape timed at load
    # the prompt's log-probabilities (echo): the same tokens scored by each kernel's prefill
    assert len(dual) == len(marlin) > 100
    assert max(abs(x - y) for x, y in zip(dual, marlin)) < 0.05, (dual, marlin)


def _requantized(vllm_artifact: tuple[Path, Path], name: str, **cfg: Any) -> Path:
    """vllm_artifact's model quantized again with GPTQ on the GPU, from its calibration set, into
    the folder `name` beside it."""
    from quantkit.config import QuantizeConfig
    from quantkit.quantize import quantize

    model, w4a16 = vllm_artifact
    out = w4a16.parent / name
    quantize(model=str(model), cfg=QuantizeConfig(method="gptq", device="cuda", **cfg),
             calib=w4a16.parent / "calib", out=out)
    return out


@pytest.fixture(scope="module")
def vllm_w4a8_artifact(vllm_artifact: tuple[Path, Path]) -> Path:
    """The same model as W4A8 (int4 g128 weights, FP8 activations per token), for vLLM's CUTLASS
    W4A8 kernel; quantized on the GPU from the same calibration set."""
    return _requantized(vllm_artifact, "w4a8", group_size=128, activations="fp8")


@pytest.mark.gpu
@needs_vllm
def test_w4a8_tiles_kernel_serves_as_vllms_own_does(vllm_w4a8_artifact: Path) -> None:
    """`quantkit serve --kernel w4a8-tiles` (quantkit's vLLM plugin: vLLM's CUTLASS W4A8 kernel
    with its tile schedule per shape and token count timed at load) loads, logs its kernel and
    its plan, and scores a prompt short enough for the plan (at most 256 tokens a step) and 4
    greedy tokens as vLLM's own choice does."""
    prompt = "def add(a, b):\n    return a + b\n" * 6
    tiles, tiles_log = _kernel_scores(vllm_w4a8_artifact, "w4a8-tiles", prompt, 4)
    own, own_log = _kernel_scores(vllm_w4a8_artifact, "vllm", prompt, 4)
    assert "Using QuantkitW4A8TilesLinearKernel for CompressedTensorsW4A8Fp8" in tiles_log
    assert "quantkit w4a8 tiles: K=" in tiles_log  # each shape timed at load
    assert "Using CutlassW4A8LinearKernel for CompressedTensorsW4A8Fp8" in own_log
    assert len(tiles) == len(own) and 20 < len(tiles) <= 256 + 4, len(tiles)
    assert max(abs(x - y) for x, y in zip(tiles, own)) < 0.05, (tiles, own)


@pytest.mark.gpu
@needs_vllm
def test_w8a16_takes_the_kernel_measured_faster_for_the_load(vllm_artifact: tuple[Path, Path]
                                                              ) -> None:
    """`quantkit serve` with its default `--kernel auto` serves an int8 weight-only artifact on
    Marlin at the default 8 slots (1.43x bf16 at one user on an H100, Machete 1.23x) and on
    Machete at 64 (0.87x bf16 there, Marlin 0.79x: docs/BENCHMARKS.md, "W8A16 on Marlin"); both
    score the prompt alike."""
    w8a16 = _requantized(vllm_artifact, "w8a16", bits=8, group_size=-1)
    prompt = "def add(a, b):\n    return a + b\n" * 6
    few, few_log = _kernel_scores(w8a16, "auto", prompt, 4, seqs=8)
    many, many_log = _kernel_scores(w8a16, "auto", prompt, 4, seqs=64)
    assert "Using MarlinLinearKernel for CompressedTensorsWNA16" in few_log
    assert "Using MacheteLinearKernel for CompressedTensorsWNA16" in many_log
    assert len(few) == len(many) > 20
    assert max(abs(x - y) for x, y in zip(few, many)) < 0.05, (few, many)


@pytest.mark.gpu
@needs_vllm
def test_doctor_reads_how_busy_the_gpu_was_under_load(vllm_artifact: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """`quantkit doctor --url` against quantkit serve on vLLM reads nvidia-smi while its load at
    8 users runs: the "gpu busy" check states the share (a tiny model leaves a fast GPU waiting
    on the host, so pass or warn, but a reading, not "too short" or "not this machine")."""
    import json
    import sys

    from _serving import Served, quantkit

    _, artifact = vllm_artifact
    s = Served(str(artifact), "--allow-unvalidated", "--engine", "vllm", "--vllm-python",
               sys.executable, "--gpu-memory-utilization", "0.3", "--log-file",
               str(tmp_path / "engine.log"), cwd=artifact.parent)
    try:
        done = quantkit("--json", "doctor", "--url", s.url, cwd=tmp_path, timeout=600)
    finally:
        s.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    by = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    busy = by["gpu busy"]
    assert busy["status"] in ("pass", "warn") and "% of the time under 8 users" in busy["reason"], busy
    share = float(busy["reason"].split("kernels ")[1].split("%")[0])
    assert 0 < share <= 100
