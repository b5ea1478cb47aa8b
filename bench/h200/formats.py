"""Device (H200, vLLM kit in /tmp/site): every format `quantkit serve` serves, side by side, on the
8B shape (Llama-3.1-8B: hidden 4096, MLP 14336, 32 layers, 32/8 heads, vocabulary 128256), each
server started by `quantkit serve` with vLLM's `--load-format dummy` (weights drawn in place:
speed does not depend on their values) from a folder holding the config.json our quantizer
writes for that format (quantization_config from quantkit.quantize.pack.quantization_config, the
function `quantkit quantize` calls) and the tests' tokenizer.

Client: `vllm bench serve` (random dataset, INPUT tokens in, 256 out (2,048: the -long jobs),
ignore EOS, seed 1) at each concurrency; `quantkit bench` (medium prompts, 256 new tokens) at 1
and 64 where a job asks.
usage: python3 bench/h200/formats.py JOB ...   (JOB: see JOBS; QK_BUDGET_S stops early,
QK_LEVELS=1,64 overrides the concurrencies, QK_QB=0 skips `quantkit bench`)
Appends rows to $OUT/h200-formats.json (the docs/data/h200-formats.json schema)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from serve_vllm import stop, wait  # noqa: E402  (this folder's: the same server handling)

from quantkit.fp8 import fp8_input_args  # noqa: E402
from quantkit.quantize.pack import quantization_config  # noqa: E402

OUT = Path(os.environ["OUT"])
W = Path("/tmp/qkfmt")
PY = shutil.which("python3") or sys.executable
START = time.time()
BUDGET = float(os.environ.get("QK_BUDGET_S", "560"))
IGNORE = ["lm_head"]
QC = {
    "bf16": None,
    "w4a16": quantization_config(4, 128, True, True, IGNORE),
    "w8a16": quantization_config(8, -1, True, False, IGNORE),
    "fp8": quantization_config(8, -1, True, False, IGNORE, float_weights=True,
                               inputs=fp8_input_args(False)),
    "fp8-static": quantization_config(8, -1, True, False, IGNORE, float_weights=True,
                                      inputs=fp8_input_args(True)),
    "w4a8": quantization_config(4, 128, True, True, IGNORE, inputs=fp8_input_args(False)),
}
# job: (format folder, serve flags, row labels, levels, input tokens, quantkit bench levels)
LEVELS = (1, 8, 32, 64)
JOBS = {
    "bf16": ("bf16", [], ("bf16", "-"), LEVELS, 512, "1,64"),
    "fp8": ("fp8", [], ("fp8", "cutlass"), LEVELS, 512, "1,64"),
    "fp8-static": ("fp8-static", [], ("fp8-static", "cutlass"), LEVELS, 512, ""),
    "fp8-online": ("bf16", ["--extra-arg=--quantization=fp8"], ("fp8-online (vllm)", "cutlass"),
                   LEVELS, 512, ""),
    "w4a8": ("w4a8", [], ("w4a8", "cutlass-w4a8"), LEVELS, 512, ""),
    # quantkit's plugin: the CUTLASS W4A8 kernel with its tile schedule timed per shape and count
    "w4a8-tiles": ("w4a8", ["--kernel", "w4a8-tiles"], ("w4a8", "w4a8-tiles"), LEVELS, 512, ""),
    # --max-num-seqs 64: `--kernel auto` leaves W8A16 on Machete at every level measured
    "w8a16": ("w8a16", [], ("w8a16", "auto"), LEVELS, 512, ""),
    # the same artifact on Marlin (which takes uint8b128 channelwise): 1.43x bf16 at one user on an
    # H100, 1.16x Machete; 0.79x at 64 (docs/data/h100-w8a16-marlin-2026-12-07.json)
    "w8a16-marlin": ("w8a16", ["--kernel", "marlin"], ("w8a16", "marlin"), LEVELS, 512, ""),
    "w4a16-marlin": ("w4a16", ["--kernel", "marlin"], ("w4a16", "marlin"), LEVELS, 512, ""),
    "w4a16-machete": ("w4a16", ["--kernel", "machete"], ("w4a16", "machete"), LEVELS, 512, ""),
    "w4a16-dual": ("w4a16", ["--kernel", "dual"], ("w4a16", "dual"), LEVELS, 512, "64"),
    "kv-bf16-8k": ("bf16", [], ("bf16 kv-auto", "-"), (8,), 8192, ""),
    "kv-fp8-8k": ("bf16", ["--kv-cache-dtype", "fp8"], ("bf16 kv-fp8", "-"), (8,), 8192, ""),
    "kv-bf16-32k": ("bf16", [], ("bf16 kv-auto", "-"), (8,), 32768, ""),
    "kv-fp8-32k": ("bf16", ["--kv-cache-dtype", "fp8"], ("bf16 kv-fp8", "-"), (8,), 32768, ""),
    # 32 users at 32k: more than bf16's cache holds on the H200 (27), fewer than FP8's (54)
    "kv-bf16-32k-c32": ("bf16", [], ("bf16 kv-auto", "-"), (32,), 32768, ""),
    "kv-fp8-32k-c32": ("bf16", ["--kv-cache-dtype", "fp8"], ("bf16 kv-fp8", "-"), (32,), 32768,
                       ""),
    # the same at 2,048 tokens out, one wave of 32: decode over long contexts, where the FP8
    # cache's halved reads could show as speed (at 256 out the 32k runs are bound by prefill)
    "kv-bf16-32k-c32-long": ("bf16", [], ("bf16 kv-auto", "-"), (32,), 32768, ""),
    "kv-fp8-32k-c32-long": ("bf16", ["--kv-cache-dtype", "fp8"], ("bf16 kv-fp8", "-"), (32,),
                            32768, ""),
    # decode-bound, as vLLM's FP8 KV write-up measures (8 users, 20k in, 2k out): protocol.py
    # --levels 8 --output-len 2048; each step reads ~23 GB of bf16 cache against 15 GB of weights
    "kv-bf16-20k": ("bf16", [], ("bf16 kv-auto", "-"), (8,), 20480, ""),
    "kv-fp8-20k": ("bf16", ["--kv-cache-dtype", "fp8"], ("bf16 kv-fp8", "-"), (8,), 20480, ""),
    # per-token FP8 with vLLM's fused RMSNorm+quant and SiLU-mul+quant kernels (its fusion passes
    # run only when the quant op is vLLM's own custom op, not Inductor's)
    "fp8-fused": ("fp8", ['--extra-arg=--compilation-config={"custom_ops":["+quant_fp8",'
                          '"+rms_norm","+silu_and_mul"]}'], ("fp8 (fused quant)", "cutlass"),
                  (1, 64), 512, ""),
}


OUTPUT_TOKENS = {"kv-bf16-32k-c32-long": 2048, "kv-fp8-32k-c32-long": 2048}  # else 256


def folder(fmt: str, ctx: int) -> Path:
    """config.json of the 8B shape (+ the format's quantization_config) and the tokenizer."""
    from _models import tiny_tokenizer
    from transformers import LlamaConfig

    out = W / f"{fmt}-{ctx}"
    if out.is_dir():
        return out
    tok_dir = W / "tok"
    if not tok_dir.is_dir():
        tiny_tokenizer(tok_dir)
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=max(ctx, 8192), rope_theta=5e5,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    out.mkdir(parents=True)
    cfg.save_pretrained(out)
    if QC[fmt] is not None:
        c = json.loads((out / "config.json").read_text())
        c["quantization_config"] = QC[fmt]
        (out / "config.json").write_text(json.dumps(c, indent=1))
    for f in tok_dir.iterdir():
        shutil.copy2(f, out / f.name)
    return out


def rows_file() -> Path:
    return OUT / "h200-formats.json"


def add_rows(rows: list[dict]) -> None:
    old = json.loads(rows_file().read_text()) if rows_file().exists() else []
    rows_file().write_text(json.dumps(old + rows, indent=1))


PROBE = ("The history of the printing press begins with movable type, cut by hand and set "
         "line by line; " * 24)


def probe(url: str, model: str, name: str) -> None:
    """One greedy completion with its top log-probabilities (the prompt's ~500 tokens take the
    large-batch kernel, the 16 decoded ones the small-batch one), kept to compare kernels."""
    import urllib.request

    body = json.dumps({"model": model, "prompt": PROBE, "max_tokens": 16, "temperature": 0,
                       "logprobs": 5}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            (OUT / f"probe-{name}.json").write_text(r.read().decode())
    except OSError as exc:
        print(f"{name}: probe failed: {exc}", flush=True)


def run_job(name: str) -> None:
    fmt, flags, (label, kernel), levels, n_in, qk_levels = JOBS[name]
    n_out = OUTPUT_TOKENS.get(name, 256)
    ctx = 2048 if n_in <= 1024 else n_in + max(512, n_out + 256)
    model = folder(fmt, ctx)
    port = 8300
    log = OUT / f"serve-{name}.log"
    cmd = [PY, "-m", "quantkit", "serve", str(model), "--engine", "vllm", "--vllm-python", PY,
           "--allow-unvalidated", "--port", str(port), "--max-num-seqs", "64", "--ctx-size",
           str(ctx), "--extra-arg=--load-format=dummy", "--log-file", str(OUT / f"engine-{name}.log"),
           *flags]
    t = time.time()
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait(url, proc)
        except RuntimeError as exc:
            print(f"{name}: {exc}\n{log.read_text()[-3000:]}")
            return
        print(f"{name}: ready after {time.time() - t:.0f} s", flush=True)
        probe(url, model.name, name)
        rows = []
        if os.environ.get("QK_LEVELS") and n_in <= 1024:
            levels = tuple(int(x) for x in os.environ["QK_LEVELS"].split(","))
        for c in levels:
            n = {1: 8, 8: 32, 32: 64, 64: 128}.get(c, 4 * c) if n_in <= 1024 else (
                2 * c if n_out == 256 else c)
            res = OUT / f"vb-{name}-c{c}.json"
            done = subprocess.run(
                [PY, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
                 "--base-url", url, "--model", model.name, "--tokenizer", str(model),
                 "--dataset-name", "random", "--random-input-len", str(n_in),
                 "--random-output-len", str(n_out), "--ignore-eos", "--temperature", "0", "--seed", "1",
                 "--num-prompts", str(n), "--max-concurrency", str(c), "--save-result",
                 "--result-dir", str(OUT), "--result-filename", res.name],
                capture_output=True, text=True)
            if done.returncode or not res.exists():
                print(f"{name} c{c}: vllm bench failed\n{done.stderr[-1500:]}")
                continue
            r = json.loads(res.read_text())
            rows.append({"model": "llama-8b-shape (dummy weights)", "format": label,
                         "kernel": kernel, "server": "quantkit", "client": "vllm bench serve",
                         "concurrency": c, "input_tokens": n_in,
                         "output_tok_s": round(r["output_throughput"], 1),
                         "ttft_p50_ms": round(r["median_ttft_ms"], 2),
                         "tpot_p50_ms": round(r["median_tpot_ms"], 3), "failed": r["failed"],
                         **({"output_tokens": n_out} if n_out != 256 else {})})
            print(json.dumps(rows[-1]), flush=True)
        if qk_levels and os.environ.get("QK_QB", "1") == "1":
            qo = W / f"qb-{name}"
            done = subprocess.run([PY, "-m", "quantkit", "-q", "--json", "bench", "--url", url,
                                   "--requests", "64", "--concurrency", qk_levels, "--endpoint",
                                   "completions", "--mix", "medium:1", "--max-tokens", "256",
                                   "--out", str(qo), "--force"], capture_output=True, text=True)
            if done.returncode:
                print(f"{name}: quantkit bench failed\n{done.stderr[-1500:]}")
            else:
                res = json.loads((qo / "results.json").read_text())
                (OUT / f"qb-{name}.json").write_text(json.dumps(res))
                for lv in res["levels"]:
                    rows.append({"model": "llama-8b-shape (dummy weights)", "format": label,
                                 "kernel": kernel, "server": "quantkit", "client": "quantkit bench",
                                 "concurrency": lv["concurrency"], "input_tokens": 256,
                                 "output_tok_s": lv["output_token_throughput"],
                                 "ttft_p50_ms": round(1000 * lv["ttft_s"]["p50"], 2),
                                 "tpot_p50_ms": round(1000 * lv["tpot_s"]["p50"], 3),
                                 "failed": lv["errors"]})
                    print(json.dumps(rows[-1]), flush=True)
        add_rows(rows)
        engine_log = (OUT / f"engine-{name}.log").read_text(errors="replace")
        kernels = sorted(set(re.findall(r"(?:Using|Selected) (\w+) for (\w+)", engine_log)))
        print(f"{name}: kernels {kernels}; {time.time() - t:.0f} s in all", flush=True)
        for line in engine_log.splitlines():
            for mark in ("quantkit dual kernel", "quantkit w4a8 tiles"):
                if mark in line:
                    print(line[line.index(mark):], flush=True)
    finally:
        stop(proc)


def main() -> None:
    W.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:]:
        left = BUDGET - (time.time() - START)
        if left < 100:
            print(f"skipped {name}: {left:.0f} s of the budget left")
            continue
        run_job(name)


if __name__ == "__main__":
    main()
