"""`quantkit auto` on the tiny model: the first candidate that passes becomes OUT; early
rejection on the domain task; exit 1 with every candidate's numbers when none passes; bad input."""

from __future__ import annotations

import json
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest

from quantkit.artifact import Manifest
from quantkit.gpu import gpu_present


@pytest.fixture(scope="module")
def setup(tiny_model: Path, tiny_calib: Path, corpus: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("auto")
    domain = root / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f.read_text()[:600]}) + "\n"
                              for f in sorted(corpus["code"].iterdir())[:6]))
    return {"model": tiny_model, "calib": tiny_calib, "domain": domain, "root": root}


def _auto(cli, s, tmp: Path, thresholds: str, *extra: str) -> tuple[int, dict, str]:
    thr = tmp / "t.yaml"
    thr.write_text(thresholds)
    code, out, err = cli("auto", str(s["model"]), "--calib", str(s["calib"]), "--thresholds",
                         str(thr), "--out", str(tmp / "art"), "--report", str(tmp / "rep"),
                         "--domain-set", str(s["domain"]), "--json", *extra)
    return code, (json.loads(out) if out.strip().startswith("{") else {}), err


@pytest.mark.slow  # quantizes and validates three candidates
def test_first_passing_candidate_becomes_the_artifact(cli, setup, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, res, err = _auto(cli, setup, tmp_path, "domain: {kld: 0.00001}\n",
                           "--candidates", "W4g128,W4g32,W8", "--tasks", "domain,sampling")
    assert code == 0, err
    names = [c["name"] for c in res["candidates"]]
    assert names == ["W4g32", "W8"] and res["skipped"][0].startswith("W4g128")
    w4, w8 = res["candidates"]
    assert w4["verdict"] == "rejected" and not w4["metrics"]["domain.kld"]["passed"]
    assert "sampling.flagged_increase" not in w4["metrics"]    # rejected before the rest ran
    assert w8["verdict"] == "pass" and res["chosen"]["name"] == "W8"
    assert w8["size_bytes"] > w4["size_bytes"] and w8["bits"] == 8 and w8["group_size"] == -1
    m = Manifest.read(tmp_path / "art")
    assert m.parameters["bits"] == 8
    rep = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert rep["artifact"]["path"] == str(tmp_path / "art") and rep["gate"]["verdict"] == "pass"
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Candidates tried by quantkit auto" in html and "W4g32" in html
    assert not list(tmp_path.glob(".art*"))  # the work folder is gone


def test_none_passes_exit_1_with_every_candidate(cli, setup, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, res, err = _auto(cli, setup, tmp_path, "domain: {kld: 0.0000000001}\n",
                           "--candidates", "W4g32,W8", "--tasks", "domain")
    assert code == 1, err
    assert [c["verdict"] for c in res["candidates"]] == ["fail", "fail"]  # domain only: no early
    assert res["chosen"] is None and all(c["metrics"]["domain.kld"]["value"] > 0
                                         for c in res["candidates"])
    assert "no candidate passed the gate" in err
    # the tiny model's layers (64, 128 wide) take groups of 64 and 32, not 128; never a GGUF type
    assert res["larger"] == ["W8g64", "W8g32"]
    assert "hint: loosen the thresholds, or try larger candidates: --candidates W8g64,W8g32" in err
    assert not (tmp_path / "art").exists() and not (tmp_path / "rep").exists()
    assert not list(tmp_path.glob(".art*"))


@pytest.mark.parametrize("case", ["no-thresholds", "unknown-candidate", "nothing-fits",
                                  "task-not-run", "unknown-metric"])
def test_bad_input_exit_2_and_nothing_written(cli, setup, tmp_path, case, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    base = ["auto", str(setup["model"]), "--calib", str(setup["calib"]), "--out",
            str(tmp_path / "art"), "--domain-set", str(setup["domain"])]
    thr = tmp_path / "t.yaml"
    thr.write_text("domain: {kld: 0.1}\n")
    args = {"no-thresholds": base,
            "unknown-candidate": base + ["--thresholds", str(thr), "--candidates", "W5g7"],
            "nothing-fits": base + ["--thresholds", str(thr), "--candidates", "W4g128,W8g256"],
            "task-not-run": base + ["--thresholds", str(thr), "--tasks", "sampling"],
            "unknown-metric": base + ["--thresholds", str(tmp_path / "u.yaml")]}[case]
    (tmp_path / "u.yaml").write_text("domain: {kl: 0.1}\n")
    code, _, err = cli(*args)
    assert code == 2, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert not (tmp_path / "art").exists() and not list(tmp_path.glob(".art*"))


@pytest.mark.parametrize("extra,words", [
    (["--prefer", "fastest"], "unknown --prefer 'fastest'"),
    (["--prefer", "speed"], "--prefer speed needs the load"),
    (["--load", "1,x"], "--load '1,x' is not a list of positive integers"),
    (["--load", "0"], "--load '0' is not a list of positive integers"),
    (["--load", "1", "--speed-margin", "2"], "--speed-margin 2.0 is outside [0, 1)"),
    (["--load", "1", "--restarts", "0"], "--restarts 0 is not 1 to 20"),
    (["--load", "1", "--repeats", "0"], "--repeats 0 is not 1 to 100")])
def test_speed_options_bad_input(cli, setup, tmp_path, extra, words, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, _, err = _auto(cli, setup, tmp_path, "domain: {kld: 0.1}\n", *extra)
    assert code == 2, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], err
    assert not (tmp_path / "art").exists() and not list(tmp_path.glob(".art*"))


def test_load_refuses_an_engine_that_cannot_serve_the_candidates_here():
    """--load serves the candidates on this machine: GGUF on llama.cpp, compressed-tensors on
    vLLM (a GPU) or transformers (CPU too); an engine that cannot is bad input before any work."""
    from quantkit.config import ServeConfig
    from quantkit.errors import BadInput
    from quantkit.speed import load_engine

    if find_spec("llama_cpp") is not None:
        assert load_engine("gguf") == "llama.cpp"
    else:  # the gguf extra left out (CI's Python 3.12 tier)
        with pytest.raises(BadInput, match="llama-cpp-python is not installed"):
            load_engine("gguf")
    assert load_engine("gptq") == ("vllm" if gpu_present() and shutil.which("vllm")
                                   else "transformers")
    with pytest.raises(BadInput, match="--load cannot serve gguf candidates here") as err:
        load_engine("gguf", ServeConfig(engine="transformers"))
    assert "leave --load out" in err.value.hint
    if not gpu_present():
        with pytest.raises(BadInput, match="--load cannot serve gptq candidates here"):
            load_engine("gptq", ServeConfig(engine="vllm"))


def _row(name, size, repeats, verdict="pass"):
    from quantkit.contract import Candidate

    med = sorted(repeats)[len(repeats) // 2] if repeats else None
    return Candidate(name, verdict=verdict, size_bytes=size,
                     speed={"output_tok_s": med, "repeats": repeats} if repeats else None)


def test_prefer_speed_takes_a_larger_candidate_only_beyond_the_noise():
    from quantkit.auto import pick

    rows = [_row("W4g32", 1, [500.0, 505.0], "fail"), _row("W4A8g128", 2, [900.0, 905.0, 895.0]),
            _row("FP8", 4, [1300.0, 1310.0, 1290.0]), _row("W8", 5, [1100.0, 1110.0, 1090.0])]
    assert pick(rows, "size").name == "W4A8g128"
    got = pick(rows, "speed")
    assert got.name == "FP8" and got.reason.startswith(
        "measurably faster than the smaller W4A8g128: FP8 is 1.44x [")
    # 2% faster, within the noise: the smaller wins and says so
    rows[2].speed = {"output_tok_s": 918.0, "repeats": [930.0, 900.0, 918.0]}
    rows[3].speed = {"output_tok_s": 880.0, "repeats": [880.0, 870.0, 890.0]}
    got = pick(rows, "speed")
    assert got.name == "W4A8g128" and got.reason.startswith(
        "no measurable difference: FP8 is 1.02x [") and "the smaller W4A8g128 wins" in got.reason
    # 5% faster with tight repeats: measurable, but inside a 10% margin
    rows[2].speed = {"output_tok_s": 945.0, "repeats": [945.0, 946.0, 944.0]}
    assert pick(rows, "speed").name == "FP8"
    assert pick(rows, "speed", margin=0.1).name == "W4A8g128"
    rows[2].speed = {"error": "vLLM exited"}  # not measured: never the fastest
    assert pick(rows, "speed").name == "W4A8g128"
    one = [_row("A", 1, [100.0]), _row("B", 2, [150.0])]  # one repeat: no interval, no claim
    assert pick(one, "speed").name == "A" and "one repeat" in pick(one, "speed").reason
    # the smallest is also the fastest: measurably, or within the noise
    two = [_row("A", 1, [200.0, 201.0, 199.0]), _row("B", 2, [100.0, 101.0, 99.0])]
    assert pick(two, "speed").reason.startswith("the smallest, and measurably the fastest: A")
    two[1].speed = {"output_tok_s": 198.0, "repeats": [190.0, 198.0, 206.0]}
    assert pick(two, "speed").reason.startswith("the smallest; no measurable difference: A")
    assert pick([_row("W4", 1, [500.0], "fail")], "speed") is None


# the demo model's (SmolLM2-135M) linear input sizes: 576 (attention, gate/up), 1536 (down)
DEMO_SHAPES = {"model.layers.0.self_attn.q_proj.weight": [576, 576],
               "model.layers.0.self_attn.k_proj.weight": [192, 576],
               "model.layers.0.mlp.up_proj.weight": [1536, 576],
               "model.layers.0.mlp.down_proj.weight": [576, 1536]}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_default_ladders_end_with_a_rung_every_model_takes():
    from quantkit.config import parse_candidate
    from quantkit.methods import METHODS
    from quantkit.quantize.preflight import check_group_size

    for method in ("gptq", "awq"):
        last = parse_candidate(method, METHODS[method].ladder[-1])
        assert last["bits"] == 8 and last["group_size"] == -1
        check_group_size(DEMO_SHAPES, LINEARS, last["group_size"])  # raises if it cannot
    assert METHODS["gguf"].ladder[-1] == "Q8_0"


def test_none_passed_offers_only_what_this_method_and_model_can_take():
    from quantkit.auto import larger_candidates, none_passed
    from quantkit.contract import AutoResult, Candidate
    from quantkit.methods import METHODS

    # 576 is not a multiple of 128: W8g128 is never offered to this model, nor a GGUF type
    larger = larger_candidates("gptq", METHODS["gptq"].ladder, DEMO_SHAPES, LINEARS)
    assert larger == ["W8g64", "W8g32"]
    assert larger_candidates("awq", ("W4g32",), DEMO_SHAPES, LINEARS) == ["W8", "W8g64", "W8g32"]
    assert larger_candidates("gguf", ("Q4_K_M", "Q5_K_M"), {}, ()) == ["Q6_K", "Q8_0"]
    assert larger_candidates("gguf", METHODS["gguf"].ladder, {}, ()) == []
    row = Candidate("W8", verdict="fail")
    err = none_passed(AutoResult("gptq", [row], None, larger=larger))
    assert err.hint == "loosen the thresholds, or try larger candidates: --candidates W8g64,W8g32"
    err = none_passed(AutoResult("gguf", [row], None, larger=[]))
    assert "W8" not in err.hint and "Q8_0" not in err.hint and "loosen the thresholds" in err.hint


def test_a_candidate_without_signal_says_so():
    from quantkit.auto import _metrics, brief
    from quantkit.gate import decide
    from quantkit.validate.stats import retention_metric

    gate = decide({"humaneval": {"retention": retention_metric([0.0] * 10, [0.0] * 10)}},
                  {"humaneval": {"retention": 0.9}})
    assert brief(_metrics(gate)) == "humaneval.retention no signal: 0/10 on both FAIL"


@pytest.mark.slow  # two GGUF candidates quantized and validated, three llama-servers load-tested
def test_auto_load_on_cpu_measures_with_intervals_and_says_why(llama_server, demo_model, cli,
                                                               tmp_path):
    """`auto --method gguf --load 1,2 --prefer speed` without a GPU: each passing candidate
    served by llama-server beside the original's F16 GGUF, in alternating order, 2 repeats each;
    every speed has its interval, and the choice says whether the difference was measurable.
    A tiny random llama with the demo's tokenizer (which llama.cpp's converter knows) carries
    the mechanics in a fraction of the demo model's time (139 s cold on 2 cores); the demo
    model's own speeds are bench/'s."""
    from _models import build
    from _serving import ROOT, check_auto_speeds, quantkit

    model, calib = build("llama", demo_model, tmp_path / "llama", vocab_size=49152), tmp_path / "c"
    code, _, err = cli("calibrate", str(model), "--source", "builtin:stdlib-docs", "--samples",
                       "16", "--min-tokens", "64", "--max-tokens", "128", "--out", str(calib))
    assert code == 0, err
    thr = tmp_path / "t.yaml"
    thr.write_text("domain: {ppl_increase: 5.0}\n")
    done = quantkit("--json", "auto", str(model), "--method", "gguf", "--candidates",
                    "Q4_K_M,Q8_0", "--calib", str(calib), "--thresholds", str(thr),
                    "--tasks", "domain", "--domain-set",
                    str(ROOT / "recipes" / "data" / "demo-domain.jsonl"),
                    "--load", "1,2", "--prefer", "speed", "--repeats", "2", "--min-seconds", "1",
                    "--requests", "2", "--warmup", "1", "--max-tokens", "8", "--mix", "short:1",
                    "--out", str(tmp_path / "art"), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout)
    assert [(c["name"], c["verdict"]) for c in res["candidates"]] == [("Q4_K_M", "pass"),
                                                                      ("Q8_0", "pass")]
    ref = res["reference"]
    assert ref["engine"] == "llama.cpp" and ref["starts"] == (2 if gpu_present() else 1)
    if not gpu_present():  # side by side, the order alternating per repeat
        assert ref["order"] == ["original", "Q4_K_M", "Q8_0", "Q8_0", "Q4_K_M", "original"]
    check_auto_speeds(res, "llama.cpp", [1, 2], 2, smallest="Q4_K_M")
    assert (tmp_path / "art").is_dir()
