"""Device, vLLM kit installed: the FP8 KV cache where decode dominates (issue 49, item 1), timed in
vLLM's offline engine so no prefill sits on the decode steps measured. USERS requests of CONTEXT
prompt tokens each are generated twice per repeat, once to 1 token (their prefill) and once to
1 + STEPS tokens (prefill, then STEPS decode steps of all USERS together); the difference over
STEPS is one decode step of the batch at that context: the TPOT a user sees in steady decode.
Prefix caching is off, so both runs prefill alike. Each start (`kv`: auto = the model's bf16, or
fp8) takes REPEATS pairs; starts alternate auto, fp8, auto, fp8 (STARTS each); the attention
backend and KV dtype vLLM logs are kept. The figure is fp8's step time over auto's, a 95%
t-interval over the repeats of both. QK_ORDER=fp8,auto starts fp8 first in each pair of starts;
QK_KV_ARGS (JSON) adds engine arguments to both sides, e.g. '{"attention_backend": "TRITON_ATTN"}',
'{"block_size": 32}' or '{"attention_config": {"flash_attn_max_num_splits_for_cuda_graph": 64}}'
(vLLM 0.26's EngineArgs; recorded as `engine_args`).
usage: python3 bench/h200/decode_kv.py MODEL_DIR OUT.json [USERS CONTEXT STEPS REPEATS STARTS]
(MODEL_DIR: a config and tokenizer, weights or not: load_format dummy)"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = "QK_DECODE_CHILD"


def child(model: str, kv: str, users: int, context: int, steps: int, repeats: int) -> None:
    """One start: REPEATS (prefill-only, prefill+decode) pairs; prints one JSON line."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.time()
    llm = LLM(model=model, load_format="dummy", kv_cache_dtype=kv, max_model_len=context + steps + 8,
              max_num_seqs=users, max_num_batched_tokens=max(8192, context),
              gpu_memory_utilization=0.85, enable_prefix_caching=False, seed=0,
              **json.loads(os.environ.get("QK_KV_ARGS") or "{}"))
    start_s = time.time() - t
    vocab = llm.get_tokenizer().vocab_size

    def prompts(seed: int) -> list[TokensPrompt]:  # fresh tokens per run: no cache can help
        return [TokensPrompt(prompt_token_ids=[(seed * 7919 + u * 104729 + i * 31) % (vocab - 1000)
                                               + 500 for i in range(context)])
                for u in range(users)]

    def timed(n: int, seed: int) -> float:
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0)
        t0 = time.perf_counter()
        llm.generate(prompts(seed), params, use_tqdm=False)
        return time.perf_counter() - t0

    timed(1 + steps, 999)  # warm-up: graphs, caches
    runs = []
    for r in range(repeats):
        prefill = timed(1, 2 * r)
        full = timed(1 + steps, 2 * r + 1)
        runs.append({"prefill_s": prefill, "full_s": full, "step_ms": (full - prefill) / steps * 1e3})
    print(json.dumps({"kv": kv, "start_s": start_s, "runs": runs}), flush=True)


def interval(ratios: list[float]) -> list[float] | None:
    from quantkit.loadtest.stats import interval as t_interval  # the protocol's t-interval

    return t_interval(ratios)


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    users, context, steps, repeats, starts = (int(a) for a in (sys.argv[3:] + [
        "8", "20000", "512", "3", "2"][len(sys.argv) - 3:]))
    rows, logs = [], {}
    order = os.environ.get("QK_ORDER", "auto,fp8").split(",")
    assert sorted(order) == ["auto", "fp8"], f"QK_ORDER={order}: auto and fp8, each once"
    for i in range(starts):
        for kv in order:
            log = Path("/tmp") / f"decode-{kv}-{i}.log"
            env = {**os.environ, CHILD: "1"}
            run = subprocess.run([sys.executable, __file__, model, kv, str(users), str(context),
                                  str(steps), str(repeats)], env=env, capture_output=True,
                                 text=True, timeout=400)
            log.write_text(run.stdout + run.stderr)
            found = [json.loads(ln) for ln in run.stdout.splitlines() if ln.startswith("{")]
            if run.returncode or not found:
                print(f"{kv} start {i} failed rc={run.returncode}:\n{run.stderr[-3000:]}")
                continue
            rows.append({**found[0], "start": i})
            logs[kv] = [ln for ln in (run.stdout + run.stderr).splitlines()
                        if "backend" in ln.lower() or "kv cache" in ln.lower()
                        or "kv_cache_dtype" in ln][:12]
            print(kv, i, [round(r["step_ms"], 3) for r in found[0]["runs"]], flush=True)
            summarize(out, rows, logs, order, users, context, steps, repeats, starts)


def summarize(out: Path, rows: list, logs: dict, order: list, users: int, context: int,
              steps: int, repeats: int, starts: int) -> None:
    """OUT.json from the starts so far (written after each: a call cut short keeps them)."""
    steps_ms = {kv: [r["step_ms"] for row in rows if row["kv"] == kv for r in row["runs"]]
                for kv in ("auto", "fp8")}
    summary = {"users": users, "context": context, "steps": steps, "repeats": repeats,
               "starts": starts, "order": order, "rows": rows, "vllm_log": logs,
               "engine_args": json.loads(os.environ.get("QK_KV_ARGS") or "{}")}
    if steps_ms["auto"] and steps_ms["fp8"]:
        auto, fp8 = statistics.median(steps_ms["auto"]), statistics.median(steps_ms["fp8"])
        # paired by repeat order (start i, repeat r) where both have it
        pairs = [a / f for a, f in zip(steps_ms["auto"], steps_ms["fp8"], strict=False)]
        summary.update({"auto_step_ms": auto, "fp8_step_ms": fp8, "fp8_speedup": auto / fp8,
                        "fp8_speedup_ci95": interval(pairs)})
        print(f"decode step at {users} users x {context} tokens: bf16 KV {auto:.2f} ms, FP8 KV "
              f"{fp8:.2f} ms: {auto / fp8:.3f}x {interval(pairs)}")
    out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    if os.environ.get(CHILD):
        child(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:7]))
    else:
        main()
