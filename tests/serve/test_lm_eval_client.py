"""An independent second client: lm-eval's own `local-completions` model pointed at `quantkit
serve`, against lm-eval run in-process on the same GGUF (llama.cpp both sides), on a small MMLU
slice. llama-server (like `transformers serve`) refuses echo+logprobs, so both sides use lm-eval's
generative MMLU variant (greedy answer letter) rather than loglikelihood scoring."""

from __future__ import annotations

from pathlib import Path

import pytest
from _serving import Served

pytestmark = pytest.mark.slow
SUBJECTS = ("astronomy", "high_school_geography")
LIMIT = 8


def _evaluate(lm) -> dict[str, list[str]]:
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    from quantkit.validate.mmlu import task_config

    configs = [task_config(s, None, 5, variant="generative") for s in SUBJECTS]  # bundled data
    tasks = TaskManager(include_defaults=False).load(configs)
    out = evaluate(lm=lm, task_dict=tasks, limit=LIMIT, bootstrap_iters=0, log_samples=True)
    answers = {}
    for name, docs in out["samples"].items():
        for d in sorted(docs, key=lambda d: d["doc_id"]):
            answers[f"{name}/{d['doc_id']}"] = (d["filtered_resps"][0], d["exact_match"])
    return answers


def test_lm_eval_through_the_server_reproduces_the_in_process_score(llama_server, demo_gguf,
                                                                    workdir):
    from lm_eval.api.registry import get_model

    from quantkit.engines.llamacpp import LlamaCppEngine
    from quantkit.validate.mmlu import QuantkitLM

    gguf = Path(demo_gguf) / "model-Q4_K_M.gguf"
    engine = LlamaCppEngine(gguf)
    try:
        local = _evaluate(QuantkitLM(engine))
    finally:
        engine.close()
    s = Served("artifacts/demo-gguf", "--max-num-seqs", "1", cwd=workdir)
    try:
        api = get_model("local-completions")(
            model="demo-gguf", base_url=s.url + "/v1/completions", tokenizer_backend=None,
            tokenized_requests=False, num_concurrent=1, max_retries=1)
        served = _evaluate(api)
    finally:
        s.stop()
    assert set(local) == set(served) and len(local) == LIMIT * len(SUBJECTS)
    same = sum(local[k][0] == served[k][0] for k in local) / len(local)
    acc_local = sum(v[1] for v in local.values()) / len(local)
    acc_served = sum(v[1] for v in served.values()) / len(served)
    print(f"answers identical {same:.2f}; exact match in-process {acc_local:.3f}, served {acc_served:.3f}")
    assert same >= 0.8, (same, local, served)
    assert abs(acc_local - acc_served) <= 0.125, (acc_local, acc_served)
