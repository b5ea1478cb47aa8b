"""Device call 3 (H200): the demo of `quantkit serve` against llama-server started by hand, on the
8B-shaped F16 and Q4_K_M GGUFs, each load-tested by `quantkit bench` at concurrency 1, 8, 32, 64.
Writes $OUT/serve-bench.json (one row per model x server) and each bench's results.json."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

W = Path("/root/qk")
OUT = Path(os.environ["OUT"])
BW = 4.24e12
LEVELS = "1,8,32,64"
SLOTS, CTX = 64, 2048
HAND_FLAGS = ["-ngl", "99", "-fa", "on", "-np", str(SLOTS), "-c", str(SLOTS * CTX), "--kv-unified",
              "-cb", "-b", "2048", "-ub", "512", "--metrics", "--no-webui"]


def wait(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit("server not ready")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench(url: str, name: str) -> dict:
    out = Path("/root/qk/bench") / name
    cmd = [sys.executable, "-m", "quantkit", "-q", "--json", "bench", "--url", url, "--requests", "64",
           "--concurrency", LEVELS, "--endpoint", "completions", "--out", str(out), "--force"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    (OUT / f"{name}.json").write_text((out / "results.json").read_text())
    return json.loads(done.stdout)


rows = []
for model in sys.argv[1:] or ["q4km", "f16"]:
    gguf = W / f"{model}.gguf"
    size = gguf.stat().st_size
    for how in ("hand", "quantkit"):
        port = 8100 if how == "hand" else 8200
        if how == "hand":
            cmd = [str(W / "build/bin/llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
                   "--port", str(port), *HAND_FLAGS]
            env = dict(os.environ)
        else:
            cmd = [sys.executable, "-m", "quantkit", "serve", str(gguf), "--allow-unvalidated",
                   "--port", str(port), "--max-num-seqs", str(SLOTS), "--ctx-size", str(CTX)]
            env = {**os.environ, "QUANTKIT_LLAMA_SERVER": str(W / "build/bin/llama-server")}
        t = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=open(W / f"{model}-{how}.log", "w"))
        try:
            wait(f"http://127.0.0.1:{port}", proc)
            ready_s = time.time() - t
            res = bench(f"http://127.0.0.1:{port}", f"{model}-{how}")
        finally:
            stop(proc)
            log = (W / f"{model}-{how}.log").read_text(errors="replace").splitlines()
            (OUT / "server-logs.txt").open("a").write(f"== {model} {how} exit {proc.returncode}\n"
                                                     + "\n".join(log[-15:]) + "\n")
        for lv in res["levels"]:
            tpot = lv["tpot_s"]["p50"]
            per_seq = 1 / tpot if tpot else None
            rows.append({"model": model, "server": how, "size_bytes": size, "ready_s": round(ready_s, 1),
                         "concurrency": lv["concurrency"], "tok_s": lv["output_token_throughput"],
                         "req_s": lv["request_throughput"], "errors": lv["errors"],
                         "ttft_p50": lv["ttft_s"]["p50"], "ttft_p99": lv["ttft_s"]["p99"],
                         "tpot_p50": tpot, "tpot_p99": lv["tpot_s"]["p99"],
                         "decode_tok_s_per_seq": per_seq,
                         # weights read once per decode step, shared by the batch
                         "bandwidth_util": (size * per_seq / BW) if per_seq else None,
                         "knee": res["knee"]["concurrency"], "recommended": res["recommended_concurrency"]})
        print(json.dumps(rows[-4:]), flush=True)
        (OUT / "serve-bench.json").write_text(json.dumps(rows, indent=1))
