"""Device, vLLM kit and lm-eval installed: MMLU on vLLM two ways, same model, same data, same
limit. Ours: `quantkit.validate.mmlu.run_mmlu` over `VllmEngine` (lm-eval's prompts and scoring,
our engine adapter). Theirs: lm-eval's own `vllm` backend (`lm_eval.models.vllm_causallms.VLLM`)
on the same task configs. Accuracy of each and the share of questions both score alike.
usage: python3 bench/h200/lmeval_vllm.py MODEL_DIR LIMIT OUT.json"""
import json
import sys
import time
from pathlib import Path

from quantkit.engines.vllm import VllmEngine
from quantkit.validate.mmlu import _pick_subjects, run_mmlu, task_config

model, limit, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
t = time.time()
engine = VllmEngine(Path(model), gpu_memory_utilization=0.3)
ours_load_s = time.time() - t
in_engine = [0.0]  # seconds inside the engine's scoring call (vLLM), the rest is lm-eval's side
score = engine.loglikelihood


def timed(requests):  # type: ignore[no-untyped-def]
    t0 = time.time()
    try:
        return score(requests)
    finally:
        in_engine[0] += time.time() - t0


engine.loglikelihood = timed  # type: ignore[method-assign]
ours = run_mmlu(engine, data_dir=None, limit=limit)
engine.close()
ours_s = time.time() - t

from lm_eval.evaluator import evaluate  # noqa: E402
from lm_eval.models.vllm_causallms import VLLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

t = time.time()
subjects = _pick_subjects(None, None)
loaded = TaskManager(include_defaults=False).load([task_config(s, None, 5) for s in subjects])
for task in loaded["tasks"].values():
    task.set_fewshot_seed(seed=1234)
lm = VLLM(pretrained=model, max_model_len=2048, gpu_memory_utilization=0.3, seed=0)
theirs_load_s = time.time() - t
res = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0, log_samples=True)
theirs_s = time.time() - t
theirs = {}
for s in subjects:
    for d in res["samples"][f"mmlu_{s}"]:
        theirs[f"{s}/{d['doc_id']}"] = int(round(d["acc"]))
paired = [(c, theirs[i]) for i, c in zip(ours["ids"], ours["correct"]) if i in theirs]
row = {"model": model, "limit_per_subject": limit, "questions": len(paired),
       "quantkit_accuracy": ours["accuracy"],
       "lm_eval_vllm_accuracy": sum(theirs.values()) / max(len(theirs), 1),
       "agreement": sum(a == b for a, b in paired) / max(len(paired), 1),
       "quantkit_s": round(ours_s, 1), "lm_eval_s": round(theirs_s, 1),
       "quantkit_load_s": round(ours_load_s, 1), "lm_eval_load_s": round(theirs_load_s, 1),
       "quantkit_in_engine_s": round(in_engine[0], 1)}
out.write_text(json.dumps(row, indent=1))
print(json.dumps(row))
