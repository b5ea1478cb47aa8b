"""`quantkit doctor`: the eight checks people run when inference is slower than expected, each
pass/warn/fail with a one-line reason and the fix. Against a running server (--url) or an
artifact (served for the checks with `quantkit serve`, then stopped)."""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from quantkit import console
from quantkit.config import BenchConfig
from quantkit.engines.choice import ENGINES
from quantkit.errors import BadInput
from quantkit.gpu import BUSY_WAITS, GpuInfo, gpu_info
from quantkit.loadtest.wire import normalize_url
from quantkit.registry import load

if TYPE_CHECKING:
    from quantkit.records import BenchLevel
    from quantkit.serve.front import DoctorHook, ServerInfo

BATCH_PASS, BATCH_WARN = 2.0, 1.3   # token throughput at concurrency 8 over 1
KV_SLOWDOWN_FAIL = 3.0              # TPOT with a ~1000-token prompt over a ~32-token one
KV_PREFILL_SHARE = 0.25             # ... unless a token costs under this share of that prompt's TTFT
GPU_RANGE = (0.85, 0.92)
GPU_BUSY_SECONDS = 3.0  # each level's counted stretch where the GPU is read (its readings: 4 a s)


class Check(TypedDict):
    """One of `quantkit doctor`'s checks: pass, warn or fail, why, and the fix."""

    check: str
    status: str
    reason: str
    fix: str


class Diagnosis(TypedDict):
    """`quantkit doctor`'s answer (its --json): the server, its engine, the checks, the worst."""

    url: str
    model: str | None
    engine: str
    checks: list[Check]
    status: str


def _check(name: str, status: str, reason: str, fix: str = "") -> Check:
    return {"check": name, "status": status, "reason": reason, "fix": fix}


def _get(url: str, api_key: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise BadInput(f"cannot reach {url}: {exc}", "start it with `quantkit serve`") from None


def _bench(url: str, api_key: str | None, min_seconds: float = 0.0, **kw: Any
           ) -> list[BenchLevel]:
    from quantkit.loadtest import bench

    # one short run per level: the checks look for 2-3x effects, not a few percent
    cfg = BenchConfig(url=url, api_key=api_key, endpoint="completions", repeats=1, warmup=0,
                      min_seconds=min_seconds, **kw)
    with tempfile.TemporaryDirectory(prefix="quantkit-doctor-") as tmp:
        res = bench(cfg=cfg, out=Path(tmp) / "b")
    return res["levels"]


def check_batching(levels: list[BenchLevel]) -> Check:
    one = levels[0]["output_token_throughput"] or 0.0
    eight = levels[-1]["output_token_throughput"] or 0.0
    ratio = eight / one if one else 0.0
    reason = f"{eight:.1f} tok/s at concurrency 8 vs {one:.1f} at 1 ({ratio:.2f}x)"
    fix = ("serve with an engine that batches: quantkit setup llama-server (llama.cpp), "
           "vLLM, or transformers --continuous-batching; raise --max-num-seqs")
    if ratio >= BATCH_PASS:
        return _check("batching", "pass", reason)
    return _check("batching", "warn" if ratio >= BATCH_WARN else "fail", reason, fix)


def check_kv_cache(short_tpot: float | None, long_tpot: float | None, metrics: str,
                   long_ttft: float | None = None) -> Check:
    """A server without a KV cache re-reads the whole prompt for every new token: its time per
    token grows with the prompt, to the order of the prompt's own prefill. Slower decoding alone
    is not that: on a CPU, attention over 1000 tokens can cost a small model 3x per token with
    the cache in use, while each token still costs a few percent of the prefill."""
    reported = [m for m in ("kv_cache_usage", "gpu_cache_usage", "n_tokens_max") if m in metrics]
    if not short_tpot or not long_tpot:
        return _check("kv cache", "warn", "could not time decoding", "re-run with a working server")
    ratio = long_tpot / short_tpot
    reason = (f"time per token with a ~1000-token prompt is {ratio:.2f}x that with a ~32-token one"
              + (f"; the engine reports {reported[0]}" if reported else ""))
    if ratio < KV_SLOWDOWN_FAIL:
        return _check("kv cache", "pass", reason)
    if long_ttft and long_tpot < KV_PREFILL_SHARE * long_ttft:
        return _check("kv cache", "pass", reason + f", but each token costs "
                      f"{long_tpot / long_ttft:.0%} of the prompt's prefill, not a re-read of "
                      "it: attention over the longer context")
    return _check("kv cache", "fail", reason, "enable the KV cache (use_cache=True; do not pass "
                  "--no-kv-offload/--no-cache flags)")


def metric_totals(metrics: str) -> dict[str, float]:
    """Each Prometheus sample's values summed over its labels, by sample name (empty for text
    that is not Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:  # an engine's /metrics that is not Prometheus text
        return {}
    return totals


def engine_says(check: str, info: ServerInfo, engine: str, metrics: str = ""
                ) -> Check | None:
    """What the engine's own doctor hook (`EngineSpec.doctor`) answers for `check`, or None."""
    spec = ENGINES.get(engine)  # None: a server quantkit does not know (or llama_cpp.server)
    if spec is None or spec.doctor is None:
        return None
    hook: DoctorHook = load(spec.doctor)
    said = hook(check, info, metric_totals(metrics))
    return None if said is None else _check(check, *said)


def check_kv_capacity(metrics: str, info: ServerInfo, engine: str) -> Check:
    """Whether the KV cache ran out under the load the server got (requests preempted), where
    the engine reports it."""
    return engine_says("kv cache capacity", info, engine, metrics) or _check(
        "kv cache capacity", "pass", f"{engine} reports no preemptions quantkit reads: nothing "
        "to check")


def check_quantized(info: ServerInfo, engine: str) -> Check:
    pid, file = info.get("engine_pid"), info.get("model_file")
    if file and pid and Path(f"/proc/{pid}/maps").exists():  # a one-file format (GGUF)
        mapped = any(ln.endswith(file) for ln in
                     Path(f"/proc/{pid}/maps").read_text().splitlines())
        bits = info.get("bits_per_weight")
        if mapped:
            from quantkit.checkpoints import label

            return _check("quantized weights", "pass", f"{engine} maps the "
                          f"{label(str(info.get('format')))} file itself "
                          f"({info.get('size_bytes', 0) / 2**20:.0f} MiB"
                          + (f", {bits} bits per weight" if bits else "") + ")")
    spec = ENGINES.get(engine)  # None: a server quantkit does not know (or llama_cpp.server)
    if spec is not None and spec.decompresses:
        return _check("quantized weights", "warn", f"{engine} decompresses compressed-tensors "
                      "weights to 16/32-bit in memory: the 4-bit saving is on disk only",
                      "serve GPTQ/AWQ with vLLM on a GPU (Marlin/Machete int4 kernels), or GGUF "
                      "with llama.cpp")
    said = engine_says("quantized weights", info, engine)  # vLLM: the kernel it logged
    if said is not None:
        return said
    return _check("quantized weights", "warn", "cannot see the engine's weights from here",
                  "run `quantkit doctor ARTIFACT` on the serving machine")


def check_gpu_offload(gpu: GpuInfo | None, info: ServerInfo) -> Check:
    if gpu is None:
        return _check("no cpu fallback", "warn", "no GPU on this machine: serving runs on the CPU",
                      "serve on a machine with a GPU for production speeds")
    pid, size = info.get("engine_pid"), info.get("size_bytes") or 0
    if pid is None:
        return _check("no cpu fallback", "warn", "the engine process is not known",
                      "run `quantkit doctor ARTIFACT` on the serving machine")
    on_gpu = gpu["procs"].get(pid, 0.0) * 2**20
    if on_gpu >= 0.8 * size:
        return _check("no cpu fallback", "pass", f"the engine holds {on_gpu / 2**30:.1f} GiB on "
                      f"the GPU for {size / 2**30:.1f} GiB of weights")
    return _check("no cpu fallback", "fail", f"the engine holds {on_gpu / 2**30:.1f} GiB on the "
                  f"GPU for {size / 2**30:.1f} GiB of weights: layers run on the CPU",
                  "build llama-server with CUDA (quantkit setup llama-server --force on the GPU "
                  "machine) and keep -ngl 999; check CUDA_VISIBLE_DEVICES")


def check_parallel_layout(info: ServerInfo, engine: str,
                          gpu: GpuInfo | None) -> Check:
    """How the model is split over the GPUs (quantkit serve's card says), and GPUs left idle."""
    gpus = gpu["count"] if gpu else 0
    tp, pp = int(info.get("tensor_parallel_size") or 1), int(info.get("pipeline_parallel_size") or 1)
    spec = ENGINES.get(engine)
    if spec is None or not spec.tensor_parallel:
        reason = f"{engine} serves the model on one device; {gpus} GPU(s) visible"
        if gpus > 1:
            return _check("parallel layout", "warn", reason, "serve a GPTQ/AWQ artifact on vLLM "
                          f"with --tensor-parallel-size {gpus} to use them all")
        return _check("parallel layout", "pass", reason)
    reason = (f"{engine} splits each layer over {tp} GPU(s) (tensor parallel) and the layers into "
              f"{pp} stage(s) (pipeline parallel); {gpus} GPU(s) visible")
    if gpus > tp * pp:
        return _check("parallel layout", "warn", reason + f": {gpus - tp * pp} idle",
                      f"restart with --tensor-parallel-size {gpus // pp} if the shapes allow "
                      "(quantkit serve checks them)")
    return _check("parallel layout", "pass", reason)


def check_gpu_busy(level: BenchLevel, gpu: GpuInfo | None, local: bool) -> Check:
    """How busy the serving GPU was under the load at `level` (quantkit bench's reading). A GPU
    that idles between steps waits on the host: the load client, the server's Python, other work
    on its cores; tokens/s falls with the busy share (+0.85% a point at 64 users on an H100)."""
    if gpu is None:
        return _check("gpu busy", "pass", "no GPU on this machine: nothing to check")
    if not local:
        return _check("gpu busy", "warn", "the server is not on this machine: its GPU cannot be "
                      "read from here", "run `quantkit doctor` on the serving machine")
    busy, users = level.get("gpu_busy_pct"), level["concurrency"]
    if busy is None:
        return _check("gpu busy", "warn", f"the load at {users} users was too short to read the "
                      "GPU's busy share", "run `quantkit bench --min-seconds 10` on this machine")
    reason = f"the GPU ran kernels {busy:.0f}% of the time under {users} users"
    if busy >= BUSY_WAITS:
        return _check("gpu busy", "pass", reason)
    return _check("gpu busy", "warn", reason + f" (below {BUSY_WAITS:.0f}%): it waits on the "
                  "host between steps", "keep other work, load clients included, off the "
                  "server's CPU cores; a model small for its GPU waits on the host by nature: "
                  "serve more users a step (--max-num-seqs) or a smaller GPU")


def check_gpu_memory(gpu: GpuInfo | None) -> Check:
    if gpu is None:
        return _check("gpu memory", "warn", "no GPU on this machine", "")
    share = gpu["used_mib"] / gpu["total_mib"]
    reason = f"{share:.0%} of {gpu['total_mib'] / 1024:.0f} GiB in use"
    lo, hi = GPU_RANGE
    if share < lo:
        return _check("gpu memory", "warn", reason + f" (below {lo:.0%}): the KV cache could be "
                      "larger", "raise --gpu-memory-utilization (vLLM) or --max-num-seqs/--ctx-size")
    if share > hi:
        return _check("gpu memory", "warn", reason + f" (above {hi:.0%}): little room for "
                      "activation spikes", "lower --gpu-memory-utilization or --max-num-seqs")
    return _check("gpu memory", "pass", reason)


def diagnose(url: str, api_key: str | None = None) -> Diagnosis:
    """The eight checks against a running OpenAI-compatible server."""
    from quantkit.gpu import is_local

    base = normalize_url(url)
    status, body = _get(base + "/v1/models", api_key)
    if status != 200:
        raise BadInput(f"{base}/v1/models answered {status}", "pass --api-key, or check the URL")
    card = (json.loads(body).get("data") or [{}])[0]
    info = cast("ServerInfo", card.get("quantkit") or {})  # quantkit serve's card (else none)
    engine = card.get("engine") or card.get("owned_by", "?")
    gpu, local = gpu_info(), is_local(base)
    short = _bench(base, api_key, GPU_BUSY_SECONDS if gpu and local else 0.0, requests=8,
                   concurrency="1,8", mix="short:1", max_tokens=32)
    long_ = _bench(base, api_key, requests=2, concurrency="1", mix="long:1", max_tokens=32)
    metrics = _get(base + "/metrics", api_key)[1].decode(errors="replace")  # after the load
    checks = [check_batching(short),
              check_kv_cache(short[0]["tpot_s"]["p50"], long_[0]["tpot_s"]["p50"], metrics,
                             long_[0]["ttft_s"]["p50"]),
              check_kv_capacity(metrics, info, engine),
              check_quantized(info, engine), check_gpu_offload(gpu, info), check_gpu_memory(gpu),
              check_parallel_layout(info, engine, gpu), check_gpu_busy(short[-1], gpu, local)]
    worst = "fail" if any(c["status"] == "fail" for c in checks) else (
        "warn" if any(c["status"] == "warn" for c in checks) else "pass")
    return {"url": base, "model": card.get("id"), "engine": engine, "checks": checks,
            "status": worst}


def doctor(*, url: str | None = None, artifact: Path | None = None, api_key: str | None = None,
           engine: str = "auto") -> Diagnosis:
    """Diagnose a server, or serve the artifact for the checks and stop it afterwards."""
    if (url is None) == (artifact is None):
        raise BadInput("give either --url URL or an ARTIFACT", "quantkit doctor --url "
                       "http://127.0.0.1:8000, or quantkit doctor artifacts/NAME")
    if url is not None:
        return diagnose(url, api_key)
    from quantkit.serve.process import quantkit_serve
    from quantkit.serve.target import resolve_target

    assert artifact is not None  # the either-or check above
    resolve_target(Path(artifact))  # what `quantkit serve` would refuse, refused here, once
    console.log(f"serving {artifact} for the checks")
    with tempfile.TemporaryDirectory(prefix="quantkit-doctor-") as tmp, quantkit_serve(
            Path(artifact), ["--engine", engine, "--allow-unvalidated"],
            Path(tmp) / "serve.log") as url:
        return diagnose(url)


