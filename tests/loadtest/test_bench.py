"""quantkit bench: the statistics, the inputs, a stand-in server's quirks and a real server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sysconfig
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantkit.config import BenchConfig
from quantkit.errors import BadInput
from quantkit.loadtest import bench, build_prompts, class_counts, parse_max_tokens, parse_mix
from quantkit.loadtest.report import render_bench_report
from quantkit.loadtest.stats import RequestRecord, find_knee, percentile, recommend, summarize_level
from quantkit.report.charts import Series, line_chart


def level(c: int, tok_s: float, ttft_p99: float = 0.1, e2e_p99: float = 1.0, errors: int = 0
          ) -> dict[str, Any]:
    """A results row with only what the knee looks at."""
    return {"concurrency": c, "requests": 100, "errors": errors, "output_token_throughput": tok_s,
            "request_throughput": tok_s / 100, "ttft_s": {"p50": ttft_p99 / 2, "p99": ttft_p99},
            "e2e_s": {"p50": e2e_p99 / 2, "p99": e2e_p99}}


# the old protocol: one run of exactly --requests per level, nothing uncounted
ONE_RUN: dict[str, Any] = {"repeats": 1, "warmup": 0, "min_seconds": 0.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- statistics ----------------------------------------------------------------------------------

@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.5, 0.05]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], q) is None and percentile([2.0], q) == 2.0


def test_level_row_from_records() -> None:
    ok = [RequestRecord("short", None, 0.1 * i, 0.1 * i + 0.9, (0.1,) * 9, 10, 30, True)
          for i in range(1, 5)]
    failed = [RequestRecord("long", "HTTP 500: boom"), RequestRecord("long", "HTTP 500: boom"),
              RequestRecord("long", "timeout")]
    row = summarize_level(4, ok + failed, wall_s=2.0)
    assert (row["requests"], row["completed"], row["errors"]) == (7, 4, 3)
    assert row["error_messages"] == ["HTTP 500: boom", "timeout"]
    assert row["request_throughput"] == 2.0 and row["output_token_throughput"] == 20.0
    assert row["tokens_counted_from"] == "usage"
    assert row["tpot_s"]["p50"] == pytest.approx(0.1) and row["itl_s"]["p99"] == pytest.approx(0.1)
    assert row["ttft_s"]["p50"] == pytest.approx(0.25) and row["ttft_s"]["p99"] <= 0.4
    assert RequestRecord("short", None, 0.1, 0.2, (), 1).tpot is None


def test_knee_where_throughput_stops_growing() -> None:
    rows = [level(c, t) for c, t in [(1, 10), (2, 20), (4, 40), (8, 80), (16, 84), (32, 85)]]
    knee = find_knee(rows)
    assert knee["concurrency"] == 8 and knee["limited_by"] == "throughput"
    assert "8 to 16" in knee["reason"]
    assert recommend(knee["concurrency"]) == 6
    assert find_knee(list(reversed(rows)))["concurrency"] == 8      # order of rows is irrelevant


def test_knee_where_p99_latency_breaks_a_target() -> None:
    rows = [level(1, 10, 0.1, 1), level(2, 20, 0.3, 1.2), level(4, 40, 0.9, 1.5),
            level(8, 80, 2.5, 3.0), level(16, 150, 6.0, 8.0)]
    ttft = find_knee(rows, p99_ttft_target=1.0)
    assert (ttft["concurrency"], ttft["limited_by"]) == (4, "ttft")
    assert "2.5 s breaks the 1 s target" in ttft["reason"]
    e2e = find_knee(rows, p99_e2e_target=1.3)
    assert (e2e["concurrency"], e2e["limited_by"]) == (2, "e2e")
    assert find_knee(rows)["limited_by"] == "max_tested"
    lowest = find_knee(rows, p99_ttft_target=0.05)
    assert lowest["concurrency"] is None and recommend(lowest["concurrency"]) == 1


def test_knee_stops_at_errors() -> None:
    knee = find_knee([level(1, 10), level(2, 20), level(4, 40, errors=3)])
    assert (knee["concurrency"], knee["limited_by"]) == (2, "errors")


@pytest.mark.parametrize(("knee", "expected"), [(1, 1), (2, 1), (4, 3), (5, 4), (10, 8),
                                                (64, 51), (None, 1)])
def test_recommendation_keeps_20_percent_headroom(knee: int | None, expected: int) -> None:
    assert recommend(knee) == expected


# -- inputs and prompts ----------------------------------------------------------------------------

def test_inputs_parse() -> None:
    assert parse_mix("short:2, long:1") == {"short": 2.0, "long": 1.0}
    assert parse_mix("medium") == {"medium": 1.0}
    assert parse_max_tokens(None) == {"short": 64, "medium": 128, "long": 128}
    assert parse_max_tokens("16") == {"short": 16, "medium": 16, "long": 16}
    assert parse_max_tokens("long:256") == {"short": 64, "medium": 128, "long": 256}
    assert class_counts(100, parse_mix("short:1,medium:1,long:1")) == {
        "short": 34, "medium": 33, "long": 33}
    assert class_counts(10, {"short": 2.0, "long": 1.0}) == {"short": 7, "long": 3}


@pytest.mark.parametrize(("option", "value", "words"), [
    ("mix", "tiny:1", "unknown prompt class"),
    ("mix", "short:x", "--mix"),
    ("mix", "short:0,long:0", "weight 0"),
    ("concurrency", "1,0,4", "--concurrency"),
    ("concurrency", "a,b", "--concurrency"),
    ("concurrency", "", "--concurrency"),
    ("requests", 0, "--requests"),
    ("max_tokens", "short:0", "--max-tokens"),
    ("max_tokens", "huge:4", "--max-tokens"),
    ("url", "localhost:8000", "--url"),
    ("endpoint", "embeddings", "--endpoint"),
    ("p99_ttft_target", -1.0, "--p99-ttft-target"),
    ("repeats", 0, "--repeats"),
    ("min_seconds", -1.0, "--min-seconds"),
    ("warmup", -1, "--warmup"),
])
def test_bad_input_is_refused_before_any_request(tmp_path: Path, option: str, value: Any,
                                                 words: str) -> None:
    given: dict[str, Any] = {"url": f"http://127.0.0.1:{free_port()}", option: value}
    with pytest.raises(BadInput) as err:
        bench(cfg=BenchConfig(**given), out=tmp_path / "out")
    assert words in err.value.message and err.value.hint
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--min-seconds", "-1"],
                                  ["--warmup", "-2"], ["--warmup", "9", "--requests", "4"]])
def test_protocol_bad_input_one_error_one_hint_exit_2(cli: Any, tmp_path: Path,
                                                      args: list[str]) -> None:
    code, _, err = cli("bench", "--url", f"http://127.0.0.1:{free_port()}", "--out",
                       str(tmp_path / "out"), *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"error: {args[0]} ") and lines[1].startswith(
        "hint: "), err
    assert list(tmp_path.iterdir()) == []


def test_prompts_are_deterministic_and_differ_per_level() -> None:
    mix, tokens = parse_mix("short:1,medium:1,long:1"), parse_max_tokens(None)
    a, b = build_prompts(12, mix, tokens, 0, 1), build_prompts(12, mix, tokens, 0, 1)
    other = build_prompts(12, mix, tokens, 0, 2)
    assert a == b
    assert [p.prompt_class for p in a] == [p.prompt_class for p in other]
    assert all(x.text != y.text for x, y in zip(a, other))
    words = {k: [len(p.text.split()) for p in a if p.prompt_class == k] for k in mix}
    assert max(words["short"]) < 40 < min(words["medium"]) <= max(words["medium"]) < 300
    assert 800 < min(words["long"])
    assert {p.max_tokens for p in a if p.prompt_class == "long"} == {128}


def test_unreachable_url_names_it_and_writes_nothing(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BadInput) as err:
        bench(cfg=BenchConfig(url=url + "/v1/", requests=2, concurrency="1"), out=tmp_path / "out")
    assert url in err.value.message and "quantkit serve" in err.value.hint
    assert list(tmp_path.iterdir()) == []


def test_existing_output_refused_unless_force(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(BadInput, match="already exists"):
        bench(cfg=BenchConfig(url=f"http://127.0.0.1:{free_port()}"), out=tmp_path / "out")


# -- charts and report ------------------------------------------------------------------------------

def test_line_chart_skips_missing_points_and_escapes() -> None:
    svg = line_chart([Series("P50 <b>", [(1, 0.5), (2, None), (4, float("nan")), (8, 2.0)]),
                      Series("empty", [])], "t<i>", "x", "y", log_x=True,
                     x_marks=[(4, "knee & 4", "#000")], y_marks=[(1.5, "target", "#f00")])
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    assert "P50 &lt;b&gt;" in svg and "knee &amp; 4" in svg and "<i>" not in svg
    assert svg.count("<circle") == 2
    assert "no data" in line_chart([Series("a", [(1, None)])], "t", "x", "y")


def test_report_is_self_contained_and_escaped() -> None:
    rows = [level(c, t) for c, t in [(1, 10), (2, 20), (4, 21)]]
    knee = find_knee(rows)
    rows[2].update(errors=1, error_messages=["<script>alert(1)</script>"])
    html = render_bench_report({"url": "http://h:1", "model": "<img src=x>", "levels": rows,
                                "knee": knee, "recommended_concurrency": recommend(2),
                                "settings": {"headroom": 0.2, "p99_ttft_target_s": 2.0}})
    assert "<script" not in html.lower() and "&lt;script&gt;" in html
    assert "<img" not in html and "&lt;img src=x&gt;" in html
    assert "http-equiv=\"Content-Security-Policy\"" in html and html.count("<svg") == 4
    assert "knee 2" in html and "recommended 1" in html and "P99 target 2 s" in html


# -- a stand-in server with the quirks of real ones ---------------------------------------------

@pytest.fixture
def fake_server() -> Iterator[dict[str, Any]]:
    """An OpenAI-compatible server on a thread: refuses ignore_eos, sends no usage, fails on cue."""
    from aiohttp import web

    state: dict[str, Any] = {"calls": 0, "fail_every": 0, "bodies": [], "withhold": None,
                             "tokens_per_word": None}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake"}, {"id": "other"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "ignore_eos" in body:
            return web.json_response({"detail": "Unexpected fields: {'ignore_eos'}"}, status=422)
        state["calls"] += 1
        state["bodies"].append(body)
        if state["fail_every"] and state["calls"] % state["fail_every"] == 0:
            return web.Response(status=500, text="<script>boom</script>")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        role = {"choices": [{"delta": {"role": "assistant"}, "index": 0}]}
        await resp.write(f"data: {json.dumps(role)}\n\n".encode())
        if state["withhold"] and state["calls"] > 1:
            # as llama-server does when every token is a partial UTF-8 byte: no token chunk,
            # then the final one (with the usage only when cued)
            end = {"choices": [{"delta": {}, "index": 0, "finish_reason": "length"}]}
            if state["withhold"] == "usage":
                end["usage"] = {"completion_tokens": body["max_tokens"], "prompt_tokens": 9}
            await resp.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
            return resp
        for i in range(body["max_tokens"]):
            await asyncio.sleep(0.002)
            chunk = {"choices": [{"delta": {"content": f" w{i}"}, "index": 0}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if state["tokens_per_word"]:  # a tokenizer that makes this many tokens of a word
            words = len(body["messages"][0]["content"].split())
            usage = {"prompt_tokens": round(words * state["tokens_per_word"]),
                     "completion_tokens": body["max_tokens"]}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat)])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{port}"
    yield state
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_refused_field_is_dropped_and_chunks_count_tokens(fake_server: dict[str, Any],
                                                          tmp_path: Path) -> None:
    res = bench(cfg=BenchConfig(url=fake_server["url"], **ONE_RUN, requests=6, concurrency="1,3",
                                max_tokens="short:3,medium:4,long:5"), out=tmp_path / "out")
    assert res["model"] == "fake" and "ignore_eos" not in res["settings"]["sent_fields"]
    assert all(b["temperature"] == 0 and b["stream"] for b in fake_server["bodies"])
    for row in res["levels"]:
        assert row["errors"] == 0 and row["tokens_counted_from"] == "chunks"
        assert row["output_tokens"] == 2 * (3 + 4 + 5)
        assert 0 < row["ttft_s"]["p50"] <= row["ttft_s"]["p99"] < row["e2e_s"]["p99"]
        assert 0 < row["itl_s"]["p50"] and row["tpot_s"]["p50"] > 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "results.json"]


def test_steady_state_repeats_warm_up_and_min_seconds(fake_server: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """Each of 3 repeats at concurrency 2: 2 warm-up requests, then counted ones for at least
    0.3 s and 4 waves, then uncounted ones until the counted finished; fresh prompts each."""
    res = bench(cfg=BenchConfig(url=fake_server["url"], concurrency=(2,), max_tokens=4,
                                model="fake", repeats=3, min_seconds=0.3, warmup=2),
                out=tmp_path / "out")
    row = res["levels"][0]
    reps = row["repeats"]
    assert [r["seed"] for r in reps] == [0, 1, 2] and row["errors"] == 0
    assert all(r["requests"] >= 8 and r["wall_s"] >= 0.3 for r in reps)  # 4 waves, 0.3 s
    assert row["requests"] == sum(r["requests"] for r in reps)
    figures = [r["output_token_throughput"] for r in reps]
    assert row["output_token_throughput"] == sorted(figures)[1]  # the median
    lo, hi = row["output_token_throughput_ci"]
    assert lo <= sum(figures) / 3 <= hi and isinstance(row["unsteady"], bool)
    assert row["ttft_p50_s"] > 0 and row["ttft_p50_s_ci"] and row["tpot_p50_s_ci"]
    # 2 probes (warm-up, tokenizer), then per repeat 2 warm-up + counted + at most 1 filler
    sent = len(fake_server["bodies"]) - 2
    assert row["requests"] + 3 * 2 <= sent <= row["requests"] + 3 * 3
    texts = [b["messages"][0]["content"] for b in fake_server["bodies"][2:]]
    assert len(set(texts)) == len(texts)  # no prompt twice: repeats and waves get fresh ones
    assert res["settings"]["repeats"] == 3 and res["settings"]["min_seconds"] == 0.3
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert html.count('class="bar"') >= 3  # throughput, TTFT and TPOT carry error bars


def test_failed_requests_are_counted_reported_and_stop_the_knee(fake_server: dict[str, Any],
                                                                tmp_path: Path) -> None:
    fake_server["fail_every"] = 4                   # the warm-up is call 1; calls 4, 8, ... fail
    res = bench(cfg=BenchConfig(url=fake_server["url"], **ONE_RUN, requests=4, concurrency=(1, 2),
                                max_tokens=2, model="fake"), out=tmp_path / "out")
    assert [r["errors"] for r in res["levels"]] == [1, 1]
    assert res["levels"][0]["error_messages"] == ["HTTP 500: <script>boom</script>"]
    assert res["knee"] == {"concurrency": None, "limited_by": "errors",
                           "reason": "1 of 4 requests failed at concurrency 1"}
    assert res["recommended_concurrency"] == 1
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "&lt;script&gt;boom" in html and "<script" not in html


def test_prompts_are_sized_by_the_servers_tokenizer(fake_server: dict[str, Any],
                                                    tmp_path: Path) -> None:
    """A server whose tokenizer makes 2.2 tokens of a word gets half the words, so a "long"
    prompt stays near 1024 tokens instead of overflowing a 2k context."""
    fake_server["tokens_per_word"] = 2.2
    res = bench(cfg=BenchConfig(url=fake_server["url"], **ONE_RUN, requests=3, concurrency=(1,),
                                max_tokens=2, model="fake"), out=tmp_path / "out")
    assert abs(res["settings"]["tokens_per_word"] - 2.2) < 0.05
    assert 950 < res["prompts"]["long"]["mean_prompt_tokens"] < 1100
    assert 220 < res["prompts"]["medium"]["mean_prompt_tokens"] < 290


@pytest.mark.parametrize("withhold", ["usage", "no-usage"])
def test_streams_without_text(fake_server: dict[str, Any], tmp_path: Path, withhold: str) -> None:
    """Tokens the server counted but never streamed as text complete the request (no TTFT);
    a stream with neither text nor a count is an error that says what arrived."""
    fake_server["withhold"] = withhold
    res = bench(cfg=BenchConfig(url=fake_server["url"], **ONE_RUN, requests=3, concurrency=(1,),
                                max_tokens=2, model="fake"), out=tmp_path / "out")
    row = res["levels"][0]
    if withhold == "usage":
        assert (row["errors"], row["no_text"], row["output_tokens"]) == (0, 3, 6)
        assert row["ttft_s"]["p50"] is None and row["e2e_s"]["p50"] > 0
        assert res["knee"]["limited_by"] == "max_tested"
        html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
        assert "3 request(s) completed with tokens counted by the server but no text" in html
    else:
        assert (row["errors"], row["no_text"]) == (3, 0)
        assert row["error_messages"] == ["the server streamed no text (2 events, finish_reason "
                                         "'length', usage None)"]


# -- a real server ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def transformers_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[str]:
    """`transformers serve` over the tiny model on a free port; its process group killed after."""
    exe = shutil.which("transformers", path=sysconfig.get_path("scripts")) or shutil.which(
        "transformers")
    if exe is None:
        pytest.skip("no `transformers` command (pip install 'transformers[serving]')")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "wb") as fh:
        # on CPU, continuous batching would otherwise take 60% of the RAM for its KV cache
        proc = subprocess.Popen([exe, "serve", str(tiny_model), "--continuous-batching",
                                 "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                                 "--cb-block-size", "32", "--cb-num-blocks", "256",
                                 "--cb-max-batch-tokens", "2048"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.slow  # starts `transformers serve`
def test_real_server_two_levels(transformers_server: str, tiny_model: Path,
                                tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = bench(cfg=BenchConfig(url=transformers_server, requests=6, concurrency=(1, 2),
                                max_tokens=6, **ONE_RUN), out=out)
    saved = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert saved["schema_version"] == 1 and saved["kind"] == "bench"
    assert saved["model"] == str(tiny_model) and saved["url"] == transformers_server
    assert saved["recommended_concurrency"] == res["recommended_concurrency"] >= 1
    assert [r["concurrency"] for r in saved["levels"]] == [1, 2]
    for row in saved["levels"]:
        assert row["errors"] == 0 and row["completed"] == 6, row["error_messages"]
        assert row["output_tokens"] == 36 and row["tokens_counted_from"] == "usage"
        assert row["request_throughput"] > 0 and row["output_token_throughput"] > 0
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            assert 0 < row[key]["p50"] <= row[key]["p99"], key
        assert row["ttft_s"]["p99"] <= row["e2e_s"]["p99"]
    assert all(p["mean_prompt_tokens"] for p in saved["prompts"].values())
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("<svg") == 4 and "TTFT vs concurrency" in html
    knee = saved["knee"]
    word = "highest tested" if knee["limited_by"] == "max_tested" else "knee"
    assert "<polyline" in html and f"{word} {knee['concurrency']}" in html


# -- how busy the serving GPU was ----------------------------------------------------------------

# nvidia-smi as a machine with two GPUs answers: GPU 0 serves (busy 80% and 40% in turn, SM at
# 1980 MHz), GPU 1 idles; one reading nvidia-smi could not take; --query-gpu=name,... for gpu_info
FAKE_SMI = """#!{python}
import sys, time
args = " ".join(sys.argv[1:])
if "utilization.gpu" in args:
    print("0, [N/A], [N/A]", flush=True)
    for i in range(100000):
        print(f"0, {{80 if i % 2 else 40}}, 1980\\n1, 0, 345", flush=True)
        time.sleep(0.05)
elif "name,memory.used" in args:
    print("NVIDIA H100 80GB HBM3, 1000, 81559\\nNVIDIA H100 80GB HBM3, 10, 81559")
"""


@pytest.fixture
def gpu_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's nvidia-smi says FAKE_SMI's (the readings under test are quantkit's)."""
    import sys

    smi = tmp_path / "smi" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")


def test_busy_log_reads_the_serving_gpu_over_a_window(gpu_here: None) -> None:
    from quantkit.gpu import busy_log, is_local

    assert is_local("http://127.0.0.1:8000") and is_local("http://localhost:1/v1")
    assert not is_local("http://10.255.255.1:8000")
    with busy_log("http://10.255.255.1:8000") as log:  # a remote server: not this GPU
        assert log is None
    with busy_log("http://127.0.0.1:8000") as log:
        assert log is not None
        t0 = time.time()
        time.sleep(1.0)
        got = log.window(t0, time.time())
        assert log.window(t0, t0 + 0.1) is None  # too few readings to say anything
    assert log.proc.poll() is not None  # nvidia-smi stopped with the block
    assert got is not None and 55 <= got["busy_pct"] <= 65 and got["sm_mhz"] == 1980  # GPU 0
    assert got["samples"] >= 10


def test_bench_records_how_busy_the_gpu_was(fake_server: dict[str, Any], gpu_here: None,
                                            tmp_path: Path) -> None:
    from quantkit.views import benched

    out = tmp_path / "out"
    res = bench(cfg=BenchConfig(url=fake_server["url"], concurrency=(1, 2), max_tokens=4,
                                model="fake", repeats=2, min_seconds=0.6, warmup=1), out=out)
    for row in res["levels"]:
        busy = [r["gpu_busy_pct"] for r in row["repeats"]]
        assert all(b is not None and 50 <= b <= 70 for b in busy), busy
        assert row["gpu_busy_pct"] == pytest.approx(statistics.median(busy))
    saved = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert saved["levels"][1]["gpu_busy_pct"] == res["levels"][1]["gpu_busy_pct"]
    shown = benched(res, out)
    assert "GPU busy" in shown.splitlines()[0] and f"{res['levels'][0]['gpu_busy_pct']:.0f}%" in shown
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<th>GPU busy</th>" in html and "the GPU waits on the host" in html


def test_bench_without_a_gpu_reads_none(fake_server: dict[str, Any], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    res = bench(cfg=BenchConfig(url=fake_server["url"], **ONE_RUN, requests=2, concurrency=(1,),
                                max_tokens=2, model="fake"), out=tmp_path / "out")
    assert res["levels"][0]["gpu_busy_pct"] is None
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "GPU busy" not in html
