"""Device (H200, vLLM kit installed): `quantkit serve` (vLLM) against `vllm serve` started by hand
with the same flags, each load-tested by `quantkit bench` at concurrency 1, 8, 32, 64 (QK_REQUESTS
requests per level, default 64, ~32/256/1024-token prompts, 64/128/128 new tokens, ignore_eos),
then a disconnect check: 64 streams dropped after their first chunk must leave the engine with no
running request.

usage: python3 bench/h200/serve_vllm.py LABEL MODEL_DIR SERVER[:KERNEL] ... [--draft DIR]
  SERVER is hand or quantkit; KERNEL auto|marlin|machete|vllm (W4A16 only; hand:auto, the
  default, is steered as quantkit's auto would be; vllm: not steered, vLLM's own choice).
Appends rows to $OUT/serve-vllm.json; each bench's results.json goes to $OUT/bench-LABEL-SERVER.json.
"""
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from quantkit.config import ServeConfig
from quantkit.serve.engines.vllm import kernel_env

OUT = Path(os.environ["OUT"])
W = Path(os.environ.get("QK_WORK", "/tmp/qk"))
LEVELS, SLOTS, CTX = os.environ.get("QK_LEVELS", "1,8,32,64"), 64, 2048
REQUESTS = os.environ.get("QK_REQUESTS", "64")
PY = shutil.which("python3") or sys.executable


def hand_command(model: Path, port: int, name: str) -> list[str]:
    """What a user types: the flags quantkit passes (serve/launch.vllm_command), spelled out."""
    return [PY, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", name, "--max-model-len", str(CTX),
            "--gpu-memory-utilization", "0.9", "--block-size", "16", "--max-num-seqs", str(SLOTS),
            "--enable-chunked-prefill"]


def quantkit_command(model: Path, port: int, kernel: str, draft: str | None, log: Path) -> list[str]:
    engine = os.environ.get("QK_SERVE_ENGINE", "vllm")  # llama.cpp: a CPU rehearsal of this script
    cmd = [PY, "-m", "quantkit", "serve", str(model), "--engine", engine,
           *(["--vllm-python", PY] if engine == "vllm" else []), "--allow-unvalidated",
           "--port", str(port), "--max-num-seqs", str(SLOTS),
           "--ctx-size", str(CTX), "--kernel", kernel, "--log-file", str(log)]
    return cmd + (["--draft-model", draft] if draft else [])


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except Exception as exc:  # noqa: BLE001 - a probe
        return getattr(exc, "code", 0) or 0, b""


def wait(url: str, proc: subprocess.Popen, timeout: float = 420) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        if get(url + "/health")[0] == 200:
            return
        time.sleep(0.5)
    raise RuntimeError("server not ready")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except ProcessLookupError:  # already gone
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def running(url: str) -> float | None:
    """vLLM's gauge of requests being decoded (through quantkit's /metrics, which appends it)."""
    _, text = get(url + "/metrics")
    vals = [float(m.group(1)) for m in re.finditer(
        rb"^(?:vllm:num_requests_running|llamacpp:requests_processing)(?:\{[^}]*\})? (\S+)", text, re.M)]
    return sum(vals) if vals else None


async def disconnect_check(url: str, model: str, n: int = 64) -> dict:
    """Open n long streams, read one chunk each, drop them all; seconds until none is running."""
    import aiohttp

    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0,
            "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        async def one():
            resp = await s.post(url + "/v1/completions", json=body)
            await resp.content.readany()
            return resp
        resps = await asyncio.gather(*[one() for _ in range(n)])
        busy = running(url)
        for r in resps:
            r.close()
    t = time.time()
    while time.time() - t < 30:
        left = running(url)
        if left == 0:
            return {"streams": n, "running_before_drop": busy, "freed_after_s": round(time.time() - t, 2)}
        await asyncio.sleep(0.2)
    return {"streams": n, "running_before_drop": busy, "freed_after_s": None, "left": running(url)}


def main() -> None:
    args = sys.argv[1:]
    draft = None
    if "--draft" in args:
        i = args.index("--draft")
        draft = args[i + 1]
        del args[i:i + 2]
    label, model, servers = args[0], Path(args[1]), args[2:]
    rows_file = OUT / "serve-vllm.json"
    rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    quantized = model.is_dir() and "quantization_config" in json.loads((model / "config.json").read_text())
    for spec in servers:
        how, _, kernel = spec.partition(":")
        kernel = kernel or "auto"
        port = 8100 if how == "hand" else 8200
        name = model.name
        env = dict(os.environ)
        tag = f"{label}-{how}" + (f"-{kernel}" if quantized else "")
        log = W / f"serve-{tag}.log"
        if how == "hand":
            cmd = hand_command(model, port, name)
            # steered as `quantkit serve --kernel KERNEL` would be (`hand:vllm`: not steered)
            env.pop("VLLM_DISABLED_KERNELS", None)
            if quantized:
                env.update(kernel_env(ServeConfig(max_num_seqs=SLOTS, kernel=kernel)))
        else:
            cmd = quantkit_command(model, port, kernel, draft, log.with_suffix(".engine.log"))
        t = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait(url, proc)
            ready_s = time.time() - t
            _, cards = get(url + "/v1/models")
            card = (json.loads(cards or b"{}").get("data") or [{}])[0]
            out = W / f"bench-{tag}"
            done = subprocess.run([PY, "-m", "quantkit", "-q", "--json", "bench", "--url", url,
                                   "--requests", REQUESTS, "--concurrency", LEVELS, "--endpoint",
                                   "completions", "--out", str(out), "--force"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-1500:])
            res = json.loads((out / "results.json").read_text())
            (OUT / f"bench-{tag}.json").write_text(json.dumps(res))
            drop = asyncio.run(disconnect_check(url, card.get("id") or name))
            _, metrics = get(url + "/metrics")
            spec_lines = [ln for ln in metrics.decode(errors="replace").splitlines()
                          if "spec_decode" in ln and not ln.startswith("#")]
        except Exception as exc:  # noqa: BLE001 - record and go on to the next server
            print(f"{tag}: FAILED {exc}", flush=True)
            rows.append({"model": label, "server": how, "error": str(exc)[-800:]})
            continue
        finally:
            stop(proc)
            lines = log.read_text(errors="replace").splitlines()
            engine_log = log.with_suffix(".engine.log")
            if engine_log.exists():
                lines = engine_log.read_text(errors="replace").splitlines() + lines
            kern = sorted({m.group(1) for ln in lines if (m := re.search(r"Using (\w+)LinearKernel", ln))})
            with (OUT / "server-logs.txt").open("a") as f:
                f.write(f"== {tag} exit {proc.returncode} kernels {kern}\n" + "\n".join(lines[-12:]) + "\n")
            time.sleep(3)
        for lv in res["levels"]:
            rows.append({"model": label, "server": how, "kernel": ",".join(kern) or "-",
                         "kernel_on_card": (card.get("quantkit") or {}).get("kernels"),
                         "ready_s": round(ready_s, 1), "concurrency": lv["concurrency"],
                         "output_tok_s": lv["output_token_throughput"],
                         "ttft_p50_s": lv["ttft_s"]["p50"], "ttft_p99_s": lv["ttft_s"]["p99"],
                         "tpot_p50_ms": round(lv["tpot_s"]["p50"] * 1000, 3) if lv["tpot_s"]["p50"] else None,
                         "errors": lv["errors"], "no_text": lv.get("no_text"),
                         "error_messages": lv["error_messages"], "disconnect": drop,
                         "draft": draft, "spec_decode_metrics": spec_lines[:12]})
        rows_file.write_text(json.dumps(rows, indent=1))
        print(tag, json.dumps([(r["concurrency"], r["output_tok_s"], r["errors"], r["no_text"])
                               for r in rows if r.get("server") == how and r.get("model") == label][-4:]),
              "ready", round(ready_s, 1), "drop", drop, flush=True)


if __name__ == "__main__":
    main()
