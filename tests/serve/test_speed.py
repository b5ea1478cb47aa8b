"""`quantkit.speed.measure`, what `quantkit auto --load` runs per candidate: the demo GGUF served
by `quantkit serve`, load-tested by `quantkit bench` at two concurrencies, then stopped."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from quantkit.config import BenchConfig
from quantkit.gpu import gpu_present
from quantkit.speed import measure, score


@pytest.mark.slow
def test_measure_serves_benches_and_stops(llama_server, demo_gguf, tmp_path):
    res = measure(demo_gguf, (1, 2), tmp_path / "speed", "demo-gguf",
                  bcfg=BenchConfig(requests=4, mix="short:1", max_tokens=16, repeats=2,
                                   min_seconds=0.5))
    levels = res["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert all(lv["failed"] == 0 and lv["output_tok_s"] > 0 and lv["tpot_p50_ms"] > 0
               for lv in levels)
    # each level: the median of its 2 repeats, with their interval
    for lv in levels:
        assert len(lv["repeats"]) == 2 and lv["ci"][0] <= sum(lv["repeats"]) / 2 <= lv["ci"][1]
    # the score is the geometric mean of the levels' output tokens/s; each repeat's score too
    a, b = (lv["output_tok_s"] for lv in levels)
    assert res["output_tok_s"] == pytest.approx((a * b) ** 0.5, rel=1e-3)
    assert len(res["repeats"]) == 2 and res["ci"] is not None
    assert res["starts"] == (2 if gpu_present() else 1)
    assert res["engine"] == "llama.cpp"  # the engine `quantkit serve` chose for a GGUF
    assert (tmp_path / "speed" / "demo-gguf-bench" / "results.json").is_file()
    assert Path(res["engine_log"]).read_text().strip()  # the engine's own log was kept
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # the server is gone
        urllib.request.urlopen(res["url"] + "/health", timeout=5)


def test_score_is_none_when_a_level_produced_nothing():
    assert score([{"output_tok_s": 100.0}, {"output_tok_s": 400.0}]) == 200.0
    assert score([{"output_tok_s": 100.0}, {"output_tok_s": None}]) is None
    assert score([]) is None


def test_memory_share_waits_for_closed_engines_then_fits_what_is_free(monkeypatch, capsys):
    """vLLM refuses to start with less free than --gpu-memory-utilization: the share asked for
    once the validation engines let go, else what is free, else a clear refusal."""
    import quantkit.gpu
    from quantkit.errors import BadInput
    from quantkit.speed import fit_memory

    readings = iter([0.5, 0.5, 0.97])  # an engine just closed lets go of its memory
    monkeypatch.setattr(quantkit.gpu, "free_share", lambda: next(readings))
    monkeypatch.setattr("quantkit.speed.time.sleep", lambda s: None)
    assert fit_memory(0.9) == 0.9
    monkeypatch.setattr(quantkit.gpu, "free_share", lambda: 0.6)  # another process holds 40%
    assert fit_memory(0.9, wait_s=0) == 0.58
    assert "--gpu-memory-utilization 0.58 (not 0.9)" in capsys.readouterr().err
    monkeypatch.setattr(quantkit.gpu, "free_share", lambda: 0.05)
    with pytest.raises(BadInput, match="5% of its memory free"):
        fit_memory(0.9, wait_s=0)
    monkeypatch.setattr(quantkit.gpu, "free_share", lambda: None)  # no GPU: nothing to fit
    assert fit_memory(0.9) == 0.9
