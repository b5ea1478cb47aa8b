"""The vLLM engine: validation on the serving engine. On CPU machines `--engine vllm` is a clear
error; the tests marked gpu run where vLLM and a GPU exist (bench/h200/gpu_tests.sh)."""

from __future__ import annotations

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


def test_engine_choice_follows_the_artifact() -> None:
    from quantkit.errors import BadInput
    from quantkit.validate import choose_engine

    assert choose_engine("gguf", "auto") == "llama.cpp"
    assert choose_engine("compressed-tensors", "transformers") == "transformers"
    assert choose_engine("compressed-tensors", "auto") == ("vllm" if HAVE_VLLM else "transformers")
    with pytest.raises(BadInput, match="cannot run a GGUF"):
        choose_engine("gguf", "vllm")
    with pytest.raises(BadInput, match="runs GGUF artifacts"):
        choose_engine("compressed-tensors", "llama.cpp")


@pytest.mark.gpu
@needs_vllm
def test_vllm_and_transformers_agree_on_an_artifact(tiny_artifact: Path) -> None:
    """The same artifact scored by vLLM and by transformers: the same greedy tokens, close
    log-probabilities, and seeded sampling that repeats."""
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine

    v = VllmEngine(tiny_artifact, max_context=512, gpu_memory_utilization=0.3)
    h = TransformersEngine(tiny_artifact, device="cuda", max_context=512)
    text = h.encode("def add(a, b):\n    return a + b\n" * 8)
    nh, nv = h.token_nlls(text), v.token_nlls(text)
    assert len(nh) == len(nv)
    assert abs(sum(nh) / len(nh) - sum(nv) / len(nv)) < 0.05
    reqs = [(h.encode("def add(a, b):"), h.encode("\n    return"))]
    assert abs(h.loglikelihood(reqs)[0][0] - v.loglikelihood(reqs)[0][0]) < 0.1
    a = v.generate_many(["x = 1\n"] * 3, max_tokens=8, temperature=0.9, top_p=0.9, seed=3)
    b = v.generate_many(["x = 1\n"] * 3, max_tokens=8, temperature=0.9, top_p=0.9, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    v.close()
    h.close()
