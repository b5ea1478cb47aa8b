"""`quantkit serve` of the demo GGUF on llama-server, driven by the official openai client."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import openai
import pytest
from _serving import Served, alive, children, get, quantkit

pytestmark = pytest.mark.slow
KEY = "sk-test-quantkit"


@pytest.fixture(scope="module")
def server(llama_server, demo_gguf, workdir):
    s = Served("artifacts/demo-gguf", "--api-key", KEY, "--max-num-seqs", "4", cwd=workdir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def test_models_names_the_artifact(client, workdir):
    assert [m.id for m in client.models.list().data] == ["demo-gguf"]
    card = client.models.list().data[0].model_dump()
    manifest = json.loads((workdir / "artifacts" / "demo-gguf" / "quantkit.json").read_text())
    # vLLM's card fields: a GGUF's root is the HF folder it was made from (its tokenizer)
    assert card["root"] == str(Path(manifest["source"]["path"]).resolve())
    assert card["parent"] is None and card["max_model_len"] > 0


def test_completion_and_chat_answer(client):
    done = client.completions.create(model="demo-gguf", prompt="The capital of France is",
                                     max_tokens=8, temperature=0)
    assert done.choices[0].text.strip() and done.usage.completion_tokens >= 1
    chat = client.chat.completions.create(
        model="demo-gguf", max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.choices[0].message.content.strip()
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_stream_matches_the_greedy_answer(client):
    messages = [{"role": "user", "content": "Name three colours."}]
    # each request computes its whole prompt: a prompt reused from llama-server's cache is
    # computed in other batch shapes, whose rounding can flip a near-tie of the greedy choice
    # (seen on an AVX-512 machine), which is the engine's arithmetic, not the stream's assembly
    fresh = {"cache_prompt": False}
    whole = client.chat.completions.create(model="demo-gguf", messages=messages, max_tokens=32,
                                           temperature=0, extra_body=fresh
                                           ).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="demo-gguf", messages=messages, max_tokens=32, temperature=0, stream=True,
        extra_body=fresh) if c.choices]
    assert sum(1 for p in parts if p) >= 2
    assert "".join(parts) == whole


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="demo-gguf", prompt="hi", max_tokens=10**6)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=b'{"model": "demo-gguf", "messages": [',
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 400 and body["error"]["code"] == "invalid_json"
    for method, path, code in (("GET", "/v1/embeddings", 404), ("GET", "/v1/completions", 405)):
        conn.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        assert r.status == code and json.loads(r.read())["error"]["message"]
    assert client.completions.create(model="demo-gguf", prompt="1, 2, 3,", max_tokens=4).choices


def test_api_key_is_required(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="demo-gguf", messages=[{"role": "user", "content": "x"}])
    status, body = get(server.url + "/v1/models")  # no key at all
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert get(server.url + "/health")[0] == 200  # health stays open for probes


def test_client_disconnect_mid_stream_is_cancelled_cleanly(server, client):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {"model": "demo-gguf", "prompt": "Write a long story about a lighthouse keeper.",
            "max_tokens": 2000, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert b"data: " in r.read(64)
    conn.sock.shutdown(2)
    conn.close()
    time.sleep(1.0)
    # the engine stopped generating for the gone client: nothing is in flight any more
    _, text = get(server.url + "/metrics", KEY)
    busy = [ln for ln in text.decode().splitlines() if ln.startswith("llamacpp:requests_processing")]
    assert busy and float(busy[0].split()[-1]) == 0, busy
    after = client.completions.create(model="demo-gguf", prompt="Hello", max_tokens=4)
    assert after.choices[0].text is not None
    status, text = get(server.url + "/metrics", KEY)
    assert status == 200
    assert b"quantkit_requests_total" in text and b"quantkit_time_to_first_token_seconds" in text
    assert b"llamacpp:" in text  # llama-server's own metrics, passed through


def test_ctrl_c_stops_the_engine_too(llama_server, demo_gguf, workdir):
    s = Served("artifacts/demo-gguf", cwd=workdir)
    engines = children(s.proc.pid)
    assert engines, "llama-server should run as a child of quantkit serve"
    code, err = s.stop()
    assert code == 0, err[-2000:]
    assert not [p for p in engines if alive(p)]


def test_refuses_what_did_not_pass_validation(demo_gguf, workdir, tmp_path):
    empty = tmp_path / "reports"
    empty.mkdir()
    done = quantkit("serve", "artifacts/demo-gguf", "--reports", str(empty), cwd=workdir,
                    timeout=120)
    assert done.returncode == 2
    assert "no validation" in done.stderr and "--allow-unvalidated" in done.stderr
    failed = tmp_path / "failed"
    (failed / "demo-gguf").mkdir(parents=True)
    res = json.loads((workdir / "reports/demo-gguf/results.json").read_text())
    res["gate"] = {"verdict": "fail", "failing": ["mmlu.retention"], "checks": [], "causes": []}
    (failed / "demo-gguf/results.json").write_text(json.dumps(res))
    done = quantkit("serve", "artifacts/demo-gguf", "--reports", str(failed), cwd=workdir,
                    timeout=120)
    assert done.returncode == 2 and "failed on mmlu.retention" in done.stderr


def test_bad_engine_and_busy_port_exit_2(demo_gguf, workdir, server):
    done = quantkit("serve", "artifacts/demo-gguf", "--engine", "vllm", cwd=workdir, timeout=120)
    assert done.returncode == 2 and "--engine vllm cannot run a GGUF artifact" in done.stderr
    done = quantkit("serve", "artifacts/demo-gguf", "--port", str(server.port), cwd=workdir,
                    timeout=120)
    assert done.returncode == 2 and "cannot listen" in done.stderr


def test_fallback_without_llama_server_warns_and_serves(demo_gguf, workdir):
    pytest.importorskip("sse_starlette", reason="llama-cpp-python[server] extras not installed")
    s = Served("artifacts/demo-gguf", cwd=workdir, env={"QUANTKIT_LLAMA_SERVER": "off"})
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        assert c.completions.create(model="demo-gguf", prompt="The sky is", max_tokens=4,
                                    temperature=0).choices[0].text
    finally:
        code, err = s.stop()
    assert "one request at a time" in err and code == 0
