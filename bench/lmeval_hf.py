"""An lm-eval task through quantkit's adapter against lm-eval's own hf backend, on the same model
and data: the score and each document's answer (docs/BENCHMARKS.md, "lm-eval tasks").

usage: python bench/lmeval_hf.py [MODEL] [TASK] [TASK_PATH] [LIMIT]
       (defaults: smollm2-135m cs_mcq recipes/tasks all; run from the repository root)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantkit.engines import engine_for  # noqa: E402
from quantkit.models import resolve_model  # noqa: E402
from quantkit.validate.lmeval import score  # noqa: E402


def main() -> None:
    args = sys.argv[1:] + [None] * 4
    model, task = args[0] or "smollm2-135m", args[1] or "cs_mcq"
    task_path, limit = args[2] or "recipes/tasks", int(args[3]) if args[3] else None
    path = resolve_model(model).path
    t = time.time()
    engine = engine_for(path, threads=0, engine="transformers")
    ours = score(engine, task, task_paths=(task_path,), limit=limit)
    ours_s = time.time() - t
    engine.close()
    import lm_eval
    from lm_eval.tasks import TaskManager

    t = time.time()
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={path},dtype=float32",
                                  tasks=[task], limit=limit, device="cpu", batch_size=8,
                                  task_manager=TaskManager(include_path=[task_path]))
    theirs_s = time.time() - t
    docs = sorted(out["samples"][task], key=lambda d: d["doc_id"])
    metric = ours["metric"]
    same = sum(float(d[metric]) == s for d, s in zip(docs, ours["scores"]))
    print(json.dumps({"model": model, "task": task, "metric": metric, "n": ours["n"],
                      "quantkit": ours["value"], "lm_eval_hf": out["results"][task][f"{metric},none"],
                      "same_answer_documents": same, "quantkit_s": round(ours_s, 1),
                      "lm_eval_hf_s": round(theirs_s, 1)}))


if __name__ == "__main__":
    main()
