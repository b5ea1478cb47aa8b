"""Device: does vLLM load and serve our GPTQ artifact of each architecture (8 dense, 4
mixture-of-experts), and do its log-probabilities agree with transformers' on the same artifact?

usage: python bench/h200/architectures.py OUT.json [KIND ...]
Per architecture, in a subprocess of its own (one vLLM engine per process): a random-weight model
(hidden 256, MLP 512, 2 layers, bf16, the tests' BPE tokenizer) built by transformers' own class,
a calibration set from the stdlib, GPTQ W4 g128 on the GPU through quantize(), the artifact
scored by transformers (CUDA) and by vLLM (prompt log-probs, eager): mean per-token NLL of each
and the largest per-token difference. A row says why when a step fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["llama", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "granite", "olmo2",
         "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
SHAPE = dict(hidden_size=256, intermediate_size=512, head_dim=64)
# experts wide enough for vLLM's fused-MoE WNA16 kernels (g128): 8 experts, 2 routed
MOE_SHAPE = {"mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
             "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                               shared_expert_intermediate_size=512),
             "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
             "olmoe": dict(num_experts=8, num_experts_per_tok=2)}


def tokenizer(out: Path) -> None:
    """The tests' tiny tokenizer (tests/_models.py's tiny_tokenizer)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _models import tiny_tokenizer

    tiny_tokenizer(out)


def one(kind: str, work: Path) -> dict:
    import sysconfig

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    import shutil

    from _models import build

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.engines.hf import TransformersEngine
    from quantkit.quantize import quantize

    row: dict = {"architecture": kind}
    t = time.time()
    shutil.rmtree(work / kind, ignore_errors=True)  # a run cut short left it
    tok = work / "tok"
    model = build(kind, tok, work / kind / "model", **SHAPE, **MOE_SHAPE.get(kind, {}),
                  tie_word_embeddings=kind.startswith("gemma"))  # vLLM's Gemma 2 requires it
    AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).save_pretrained(model)
    src = work / f"stdlib-{kind}"  # one per worker: two processes may run at once
    if not src.is_dir():
        src.mkdir()
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[40:100]:
            (src / p.name).write_text(p.read_text(errors="replace"))
    calibrate(model=str(model), out=work / kind / "calib", cfg=CalibrateConfig(
        sources=(str(src),), samples=16, min_tokens=128, max_tokens=128))
    art = work / kind / "artifact"
    m = quantize(model=str(model), cfg=QuantizeConfig(method="gptq", group_size=128,
                                                      device="cuda"),
                 calib=work / kind / "calib", out=art)
    row.update(quantized=True, quantize_s=m.wall_time_s, structure=m.structure,
               experts={k: v for k, v in (m.experts or {}).items() if k != "layers"} or None)
    h = TransformersEngine(art, device="cuda", max_context=512)
    ids = h.encode((ROOT / "quantkit" / "cli.py").read_text()[:3000])[:400]
    nh = h.token_nlls(ids)
    row["transformers_nll"] = round(sum(nh) / len(nh), 5)
    h.close()
    from vllm import LLM, SamplingParams, TokensPrompt

    try:
        llm = LLM(model=str(art), max_model_len=512, enforce_eager=True, seed=0,
                  gpu_memory_utilization=0.3, max_logprobs=-1)
    except Exception as exc:  # noqa: BLE001 - what vLLM says is the finding
        row.update(vllm_loads=False, vllm_error=f"{type(exc).__name__}: {str(exc)[:400]}")
        return row
    full = h.prefix + ids
    out = llm.generate(TokensPrompt(prompt_token_ids=full),
                       SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    nv = [-out.prompt_logprobs[p][full[p]].logprob for p in range(1 + len(h.prefix), len(full))]
    greedy = llm.generate(TokensPrompt(prompt_token_ids=full[:64]),
                          SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)[0]
    row.update(vllm_loads=True, vllm_nll=round(sum(nv) / len(nv), 5),
               nll_mean_abs_diff=round(abs(sum(nv) / len(nv) - row["transformers_nll"]), 5),
               tokens=len(nv), vllm_greedy_tokens=len(greedy.outputs[0].token_ids),
               seconds=round(time.time() - t, 1))
    return row


def main() -> None:
    from concurrent.futures import ThreadPoolExecutor

    out = Path(sys.argv[1])
    kinds = sys.argv[2:] or KINDS
    work = Path("/tmp/qk-arch")
    work.mkdir(exist_ok=True)
    tokenizer(work / "tok")  # made once, before the workers share it
    rows = []

    def run(kind: str) -> dict:
        t = time.time()
        try:
            done = subprocess.run([sys.executable, __file__, "--one", kind, str(work)],
                                  capture_output=True, text=True, timeout=240)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {
                "architecture": kind, "error": (done.stderr or done.stdout)[-600:]}
        except subprocess.TimeoutExpired:
            row = {"architecture": kind, "error": "timed out after 240 s"}
        row["wall_s"] = round(time.time() - t, 1)
        return row

    # two architectures at a time: each engine takes 0.3 of the GPU's memory
    with ThreadPoolExecutor(int(os.environ.get("QK_ARCH_WORKERS", "2"))) as pool:
        for row in pool.map(run, kinds):
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "structure"}), flush=True)
            out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], Path(sys.argv[3]))), flush=True)
    else:
        main()
