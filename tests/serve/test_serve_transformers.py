"""`quantkit serve` of a compressed-tensors checkpoint on `transformers serve` (continuous
batching), through the openai client; /health says 503 until the engine is warm."""

from __future__ import annotations

import json
import threading

import openai
import pytest
from _serving import Served, get, quantkit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_artifact, tmp_path_factory):
    s = Served(str(tiny_artifact), "--allow-unvalidated", "--engine", "transformers",
               cwd=tmp_path_factory.mktemp("serve"))
    yield s
    s.stop()


def test_health_is_503_until_warm_then_200(server):
    assert server.health[0] == 503 and server.health[-1] == 200
    assert json.loads(get(server.url + "/health")[1])["engine"] == "transformers"


def test_openai_client_completion_chat_and_stream(server, tiny_artifact):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    card = c.models.list().data[0].model_dump()
    name = card["id"]
    assert name == tiny_artifact.name
    # vLLM's model card beside OpenAI's fields: `vllm bench serve` loads its tokenizer from root
    assert card["object"] == "model" and card["owned_by"] == "quantkit" and card["created"] > 0
    assert card["root"] == str(tiny_artifact.resolve()) and card["parent"] is None
    assert card["max_model_len"] == 2048  # the tiny model's context (under the 4096 cap)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(card["root"]).encode("def add")
    done = c.completions.create(model=name, prompt="def add(a, b):", max_tokens=6, temperature=0)
    assert done.usage.completion_tokens == 6 and done.choices[0].text
    chat = c.chat.completions.create(model=name, max_tokens=5, temperature=0,
                                     messages=[{"role": "user", "content": "hi"}])
    assert chat.usage.completion_tokens == 5
    chunks = [x for x in c.completions.create(model=name, prompt="import os", max_tokens=5,
                                              temperature=0, stream=True) if x.choices]
    whole = c.completions.create(model=name, prompt="import os", max_tokens=5,
                                 temperature=0).choices[0].text
    # random weights emit partial UTF-8: the stream holds those bytes back, the whole text shows U+FFFD
    streamed = "".join(x.choices[0].text for x in chunks)
    assert len(chunks) >= 3 and streamed.rstrip("\ufffd") == whole.rstrip("\ufffd")


def test_concurrent_requests_all_answer(server, tiny_artifact):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    out: list[int] = []

    def one(i: int) -> None:
        r = c.completions.create(model=tiny_artifact.name, prompt=f"{i} + {i} =", max_tokens=8)
        out.append(r.usage.completion_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == [8] * 6


def test_unvalidated_checkpoint_is_refused_without_the_flag(tiny_artifact, tmp_path):
    done = quantkit("serve", str(tiny_artifact), cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "no validation" in done.stderr
