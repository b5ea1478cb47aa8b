"""Device, vLLM kit installed: what a validation engine's start costs and buys. The 8B recipe's
validation spent 192 s of its 309 s starting two vLLM engines (docs/BENCHMARKS.md, third run);
this starts one engine per variant, each in a fresh process as validation does, and runs the
same work on each: HumanEval's shape (164 prompts, 384 greedy tokens, no early stop) and MMLU's
(1,024 prompts of 600 tokens in groups of 16 that share a 500-token head, one token with its 20
top log-probabilities). Variants: quantkit's START_MODES (quantkit/engines/vllm.py, which
$QUANTKIT_VLLM_START picks in validation) and one more of vLLM 0.26's own options:
  compiled   vLLM's default (torch.compile, CUDA graphs up to 512 sequences)
  graphs     no torch.compile, full CUDA graphs for decode (compilation mode 0, FULL_DECODE_ONLY)
  eager      enforce_eager: no compile, no graphs
  capped     torch.compile, CUDA graphs captured up to 64 sequences only
Each row: seconds to a ready engine, seconds for each workload, and against the first variant
run: the share of greedy sequences token for token identical, and the largest difference of a
top log-probability (what a scored answer reads). Weights are vLLM's dummy ones (the same in
every process), the model a config and tokenizer only (decode_kv.sh put): the start's cost is
compile and graphs, not the disk.
usage: python3 bench/h200/vllm_start.py MODEL OUT.json VARIANT...   (in the given order)
       python3 bench/h200/vllm_start.py --one VARIANT MODEL OUT.json (one start, one process)"""
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package beside the bench
from quantkit.engines.vllm import START_MODES  # noqa: E402

VARIANTS = {**START_MODES, "capped": {"compilation_config": {"max_cudagraph_capture_size": 64}}}


def one(variant: str, model: str, out: Path) -> None:
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.time()
    llm = LLM(model=model, max_model_len=2048, seed=0, gpu_memory_utilization=0.40,
              enable_prefix_caching=True, max_logprobs=-1, load_format="dummy",
              skip_tokenizer_init=True, **VARIANTS[variant])
    ready_s = time.time() - t
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(0)
    gen = [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab) for _ in range(200)])
           for _ in range(164)]
    t = time.time()
    outs = llm.generate(gen, SamplingParams(max_tokens=384, temperature=0, ignore_eos=True,
                                              detokenize=False),
                        use_tqdm=False)
    gen_s = time.time() - t
    heads = [[rng.randrange(100, vocab) for _ in range(500)] for _ in range(64)]
    score = [TokensPrompt(prompt_token_ids=heads[i // 16]
                          + [rng.randrange(100, vocab) for _ in range(100)]) for i in range(1024)]
    t = time.time()
    scored = llm.generate(score, SamplingParams(max_tokens=1, temperature=0, logprobs=20,
                                                 detokenize=False),
                          use_tqdm=False)
    score_s = time.time() - t
    out.write_text(json.dumps({
        "variant": variant, "ready_s": round(ready_s, 1), "humaneval_shape_s": round(gen_s, 1),
        "mmlu_shape_s": round(score_s, 1),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "top": [{str(k): v.logprob for k, v in o.outputs[0].logprobs[0].items()}
                for o in scored]}))


def main() -> None:
    if sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        return
    model, out, order = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    rows, first = [], None
    for i, variant in enumerate(order):
        part = out.with_suffix(f".{i}.json")
        t = time.time()
        run = subprocess.run([sys.executable, __file__, "--one", variant, model, str(part)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            rows.append({"variant": variant, "error": run.stderr[-1500:]})
            print(variant, "failed:", run.stderr[-600:], flush=True)
            continue
        got = json.loads(part.read_text())
        got["process_s"] = round(time.time() - t, 1)
        if first is None:
            first = got
        else:
            got["same_greedy_share"] = sum(a == b for a, b in zip(got["tokens"], first["tokens"])
                                           ) / len(first["tokens"])
            diffs = [abs(v - ref[k]) for mine, ref in zip(got["top"], first["top"])
                     for k, v in mine.items() if k in ref]
            got["max_top_logprob_diff"] = max(diffs) if diffs else None
            got["compared_to"] = first["variant"]
        row = {k: v for k, v in got.items() if k not in ("tokens", "top")}
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
