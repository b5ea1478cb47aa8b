"""Device: do quantkit's compressed-tensors artifacts load in vLLM, and does vLLM compute what
transformers computes on them? One JSON row per artifact (and kernel) to --out.

For each artifact folder: vLLM's offline engine loads it (the kernel it picks is read from its
log), scores the same prompts as transformers (greedy next-token logits: top-1 agreement and
max |diff| of log-probabilities over the prompt positions), and quantkit's own engines
(engines.vllm.VllmEngine vs engines.hf.TransformersEngine) answer loglikelihood, token_nlls and
generate on both. usage: python3 bench/h200/vllm_check.py --out OUT.json ARTIFACT [ARTIFACT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a quiet",
           "Water boils at a temperature of", "import numpy as np\nx = np.", "The three primary"]


def one(path: str, kernel: str) -> dict:
    """Run in a fresh process (vLLM holds the GPU until exit): see main()."""
    import torch

    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.vllm import VllmEngine

    row: dict = {"artifact": path, "kernel_forced": kernel}
    t = time.time()
    v = VllmEngine(Path(path), max_context=1024, gpu_memory_utilization=0.4)
    row["vllm_load_s"] = round(time.time() - t, 1)
    h = TransformersEngine(Path(path), device="cuda", max_context=1024)
    seqs = [h.prefix + h.encode(p) for p in PROMPTS]
    # log-probabilities of every prompt token under both engines
    lp_v = v._prompt_logprobs(seqs)
    diffs, agree, total = [], 0, 0
    for seq, lv in zip(seqs, lp_v):
        ids = torch.tensor([seq], device="cuda")
        with torch.no_grad():
            logits = h.model(input_ids=ids).logits.float()[0]
        logp = torch.log_softmax(logits, -1)
        for pos in range(1, len(seq)):
            tok = seq[pos]
            diffs.append(abs(float(logp[pos - 1, tok]) - float(lv[pos][tok].logprob)))
            top_h = int(logp[pos - 1].argmax())
            top_v = next(t for t, lp in lv[pos].items() if lp.rank == 1)
            agree += int(top_h == top_v)
            total += 1
    row.update(positions=total, top1_agreement=round(agree / total, 4),
               max_abs_logprob_diff=round(max(diffs), 4),
               mean_abs_logprob_diff=round(sum(diffs) / len(diffs), 5))
    # quantkit's engine interface on both: the same numbers validation would use
    reqs = [(h.encode(p), h.encode(" Paris")) for p in PROMPTS[:1]] + [
        (h.encode(p[:-5]), h.encode(p[-5:])) for p in PROMPTS[1:]]
    ll_h, ll_v = h.loglikelihood(reqs), v.loglikelihood(reqs)
    row["loglikelihood_max_diff"] = round(max(abs(a[0] - b[0]) for a, b in zip(ll_h, ll_v)), 4)
    row["loglikelihood_greedy_agree"] = sum(a[1] == b[1] for a, b in zip(ll_h, ll_v)) / len(reqs)
    text = h.encode(" ".join(PROMPTS) * 8)
    nh, nv = h.token_nlls(text), v.token_nlls(text)
    row["token_nlls_len"] = [len(nh), len(nv)]
    row["mean_nll"] = [round(sum(nh) / len(nh), 4), round(sum(nv) / len(nv), 4)]
    gh = h.generate_many([h.chat_prompt(p) for p in PROMPTS], max_tokens=24)
    gv = v.generate_many([v.chat_prompt(p) for p in PROMPTS], max_tokens=24)
    row["greedy_first_token_agree"] = sum(
        bool(a.token_ids[:1] == b.token_ids[:1]) for a, b in zip(gh, gv)) / len(PROMPTS)
    s1 = v.generate_many(PROMPTS, max_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    s2 = v.generate_many(PROMPTS, max_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    row["seeded_sampling_repeats"] = all(a.token_ids == b.token_ids for a, b in zip(s1, s2))
    row["vllm_version"] = v.version
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", nargs=2, metavar=("ARTIFACT", "KERNEL"))
    ap.add_argument("--kernels", default="default")
    ap.add_argument("artifacts", nargs="*")
    a = ap.parse_args()
    if a.worker:
        print("ROW " + json.dumps(one(*a.worker)), flush=True)
        return
    rows = []
    for art in a.artifacts:
        for kernel in a.kernels.split(","):
            env = dict(os.environ)
            if kernel == "marlin":  # vLLM picks Machete on Hopper unless it is disabled
                env["VLLM_DISABLED_KERNELS"] = "MacheteLinearKernel"
            done = subprocess.run([sys.executable, __file__, "--out", a.out, "--worker", art,
                                   kernel], capture_output=True, text=True, env=env, timeout=400)
            log = done.stdout + done.stderr
            row = next((json.loads(ln[4:]) for ln in done.stdout.splitlines()
                        if ln.startswith("ROW ")), {"artifact": art, "kernel_forced": kernel,
                                                    "error": log[-1500:]})
            from quantkit.serve.engines.vllm import kernel_from_log

            row["kernel_used"] = next((k for k in map(kernel_from_log, log.splitlines()) if k),
                                      None)
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
