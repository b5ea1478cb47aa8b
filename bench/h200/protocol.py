"""Device (H200, vLLM kit in /tmp/site): servers compared the way a speed claim should be made
(issue 35), the one measurement script later H200 runs reuse.

Each server of `formats.py`'s JOBS (the 8B shape, dummy weights, started by `quantkit serve`) is
started `--restarts` times in alternating order (A B, B A: drift on the machine falls on both);
at each start every level gets a warm-up (one wave: `concurrency` requests, not counted) and then
`--repeats` runs of `vllm bench serve`, each with its own seed (fresh random prompts: no prefix-
cache hits between runs) and enough prompts for both 4 waves and `--min-seconds` (from the warm-
up's request rate; `QK_RANGE_RATIO=0.5` draws input and output lengths from +-50% of theirs,
which desynchronises the requests: docs/BENCHMARKS.md, "Why c=64 swung"). nvidia-smi logs the
SM clock, power, temperature and the share of time the GPU was busy once a second, and each run
records their means over its window, the cores each process kept busy (`cpu_cores`: the client,
quantkit serve's front, vLLM's API server and engine core) and what the engine's own counters say
of its steps (`engine`: wall time and tokens a step, inter-token latency, queue time); each start
records vLLM's torch.compile and CUDA-graph times from the engine log. `--via front,direct`
load-tests the same engine through quantkit serve's front and at vLLM's own port, in alternating
repeats with the same prompts: `NAME@direct` against `NAME` is what the front costs.

Output ($OUT): h200-protocol.json (one row per server, level and start: every repeat's tok/s, TTFT
and TPOT p50, the clocks; and `summary`: per server and level the median of all repeats, its 95%
t-interval, the GPU's busy share (least, median, most), and the ratio to the first server with its
interval: Welch on the logarithms, quantkit.loadtest.stats, the statistics `quantkit bench` and
`auto --load` use), the engine logs, nvidia-smi.csv.

usage: python3 bench/h200/protocol.py --servers bf16,fp8-static [--levels 1,64] [--repeats 3]
       [--min-seconds 15] [--restarts 2] [--run LABEL] [--starts A,B --first-start 0] [--budget-s S]
       [--output-len 256] [--waves 4] [--via front,direct]   (the FP8 KV cache where decode
       dominates: --servers kv-bf16-20k,kv-fp8-20k --levels 8 --output-len 2048 --waves 1)
(`--starts` names the starts of this call, in order, for a run split over device calls (A B in
one call, B A in the next, `--first-start 2`); rows carry `order` and `start`; `--summarize
FILE...` merges the rows of several calls; rows carry their GPU's name and uuid as `machine`
(`--machine FILE=NAME`, once per file, names older files' machines); with two machines the
summary adds each server's median on each and how far apart they are, `machines_apart`,
and takes each ratio only from the machines that ran both servers. Every ratio is against
`--base` (bf16), whichever server a call's first start ran.)
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from formats import JOBS, PY, W, folder  # noqa: E402
from serve_vllm import get, stop, wait  # noqa: E402

from quantkit.loadtest.doctor import metric_totals  # noqa: E402
from quantkit.loadtest.stats import in_round, interval, median, ratio_interval, spread  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/qkout"))
SMI = ["timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu"]


class Smi:
    """nvidia-smi once a second into OUT/nvidia-smi.csv; the means over a time window."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, list[float]]] = []
        self.file = (OUT / "nvidia-smi.csv").open("a")
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(SMI)}",
                                      "--format=csv,noheader,nounits", "-lms", "1000"],
                                     stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.file.write(line)
            try:
                self.rows.append((time.time(), [float(x) for x in line.split(",")[1:]]))
            except ValueError:
                continue

    def window(self, t0: float, t1: float) -> dict:
        got = [v for t, v in self.rows if t0 <= t <= t1]
        if not got:
            return {}
        mean = [round(sum(col) / len(col), 1) for col in zip(*got)]
        return dict(zip(("sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct"), mean))

    def close(self) -> None:
        self.proc.terminate()
        self.file.close()


class Tree:
    """CPU seconds so far of the client (this process: `vllm bench serve` runs in it) and of
    quantkit serve's processes by role: the front (quantkit serve itself), vLLM's API server, its
    engine core. At 64 users the repeats whose GPU sat idle a third of the time ran ~20% slower
    (2026-12-07): these say which process was busy while it waited."""

    ROLES = (("engine", "EngineCore"), ("api", "cli.main serve"))

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def seconds(self) -> dict[str, float]:
        try:
            import psutil  # vLLM's dependency
        except ImportError:
            return {}

        def cpu(p: psutil.Process) -> float:
            t = p.cpu_times()
            return t.user + t.system

        got = {"client": cpu(psutil.Process())}
        try:
            front = psutil.Process(self.pid)
            got["front"] = cpu(front)
            for child in front.children(recursive=True):
                try:
                    line = " ".join(child.cmdline())
                    role = next((r for r, key in self.ROLES if key in line), "other")
                    got[role] = got.get(role, 0.0) + cpu(child)
                except psutil.Error:  # gone between the listing and the reading
                    continue
        except psutil.Error:
            pass
        return got


def cores(before: dict, after: dict, wall: float) -> dict:
    """Each role's CPU seconds over a window as cores kept busy (1.0: one core all the time)."""
    if wall <= 0:
        return {}
    return {k: round((after[k] - before.get(k, 0.0)) / wall, 2) for k in after}


def engine_totals(url: str) -> dict[str, float]:
    """quantkit serve's /metrics (vLLM's own counters appended) summed over labels, by sample
    name, as `quantkit doctor` reads it."""
    return metric_totals(get(url + "/metrics")[1].decode(errors="replace"))


def engine_steps(before: dict, after: dict, wall: float) -> dict:
    """What the engine did over a window: its steps' mean wall time (idle between them included)
    and tokens (the running batch, plus prefill chunks), and its own inter-token latency and queue
    time; a client or front that falls behind shows as fewer tokens a step than users."""
    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    out = {}
    if (steps := d("vllm:iteration_tokens_total_count")) > 0:
        out["step_ms"] = round(wall * 1e3 / steps, 3)
        out["tokens_per_step"] = round(d("vllm:iteration_tokens_total_sum") / steps, 1)
    for key, name in (("itl_ms", "inter_token_latency"), ("queue_ms", "request_queue_time")):
        if (n := d(f"vllm:{name}_seconds_count")) > 0:
            out[key] = round(d(f"vllm:{name}_seconds_sum") * 1e3 / n, 3)
    return out


def engine_url(url: str) -> str:
    """vLLM's own address behind quantkit serve's front: the `--port` of the engine command in
    its card (/v1/models, `quantkit.engine_command`)."""
    cmd = json.loads(get(url + "/v1/models")[1])["data"][0]["quantkit"]["engine_command"]
    return f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"


def gpu() -> str:
    """This machine's GPU, named and told apart from another of its kind: 'NAME GPU-uuid'."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "-"


RANGE = ["--random-range-ratio", os.environ.get("QK_RANGE_RATIO", "0.0")]
# The harness's tokenizer has 1,024 tokens, and vLLM's random prompts are runs of consecutive ids
# from a random offset: two prompts of 448 share their first block often, and the prefix cache's
# hit rate climbed to 50-62% over a start's c=64 repeats (2026-12-04), each repeat faster than the
# last. No prefix caching unless QK_PREFIX_CACHE=1: a speed figure measures the kernels, not luck.
PREFIX = [] if os.environ.get("QK_PREFIX_CACHE") == "1" else ["--extra-arg=--no-enable-prefix-caching"]


def bench(url: str, model: Path, n_in: int, n_out: int, c: int, prompts: int, seed: int,
          tag: str) -> dict | None:
    """One run of `vllm bench serve`, in this process (vLLM's own client, its CLI's code and
    arguments: importing vLLM once instead of once a run saves ~12 s each): its result, or None
    (printed) when it failed."""
    import contextlib
    import io

    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        ["--backend", "openai", "--base-url", url, "--model", model.name, "--tokenizer",
         str(model), "--dataset-name", "random", "--random-input-len", str(n_in),
         "--random-output-len", str(n_out), "--ignore-eos", "--temperature", "0", "--seed",
         str(seed), "--num-prompts", str(prompts), "--max-concurrency", str(c), *RANGE])
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            out = main(args)
    except Exception as exc:  # noqa: BLE001 - one failed run is reported, the others go on
        print(f"{tag}: vllm bench failed: {type(exc).__name__}: {exc}\n{said.getvalue()[-1500:]}",
              flush=True)
        return None
    (OUT / "vllm-bench.txt").open("a").write(f"== {tag}\n{said.getvalue()[-3000:]}\n")
    return out


def engine_times(log: Path) -> dict:
    """torch.compile's and CUDA graph capture's seconds at this start, from vLLM's log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = {}
    for key, pattern in (("compile_s", r"torch\.compile takes ([\d.]+) s"),
                         ("graphs_s", r"Graph capturing finished in ([\d.]+) sec"),
                         ("init_s", r"init engine .* took ([\d.]+) seconds"),
                         ("prefix_hit_pct", r"Prefix cache hit rate: ([\d.]+)%")):
        hits = re.findall(pattern, text)
        if hits:
            found[key] = float(hits[-1])
    return found


def run_start(name: str, args: argparse.Namespace, start: int, order: int, smi: Smi,
              save=lambda rows: None) -> list:
    """One start of server `name`: its rows, one per level (`save(rows)` after each level, so a
    call cut by its time limit keeps the levels it finished)."""
    fmt, flags, (label, kernel), _, n_in, _ = JOBS[name]
    n_out = args.output_len
    ctx = max(2048, -(-(n_in + n_out + 64) // 1024) * 1024)  # re-encoding adds a few tokens
    model = folder(fmt, ctx)
    port = 8300 + start
    log, engine_log = OUT / f"serve-{name}-s{start}.log", OUT / f"engine-{name}-s{start}.log"
    cmd = [PY, "-m", "quantkit", "serve", str(model), "--engine", "vllm", "--vllm-python", PY,
           "--allow-unvalidated", "--port", str(port), "--max-num-seqs", "64", "--ctx-size",
           str(ctx), "--extra-arg=--load-format=dummy", "--log-file", str(engine_log), *PREFIX, *flags]
    t = time.time()
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url, rows, tree = f"http://127.0.0.1:{port}", [], Tree(proc.pid)
    try:
        try:
            wait(url, proc)
        except RuntimeError as exc:
            print(f"{name} start {start}: {exc}\n{log.read_text()[-3000:]}", flush=True)
            return rows
        ready = round(time.time() - t, 1)
        print(f"{name} start {start}: ready after {ready} s", flush=True)
        # --via front,direct: the same engine load-tested through quantkit serve's front and at
        # vLLM's own port, repeat by repeat in alternating order; the direct rows' server is
        # NAME@direct, so the summary's ratio of the two is what the front costs
        urls = {via: url if via == "front" else engine_url(url) for via in args.via}
        for c in args.levels:
            seed0 = 1000 * (start + 1) + 10 * c
            w0 = time.time()
            warm = bench(url, model, n_in, n_out, c, c, seed0, f"{name}-s{start}-c{c}-warm")
            rate = warm["completed"] / warm["duration"] if warm and warm["duration"] else 1.0
            prompts = max(args.waves * c, math.ceil(args.min_seconds * rate / c) * c)
            reps: dict[str, list] = {via: [] for via in args.via}
            for r in range(args.repeats):
                for via in in_round(args.via, r):
                    t0, cpu0, eng0 = time.time(), tree.seconds(), engine_totals(url)
                    got = bench(urls[via], model, n_in, n_out, c, prompts, seed0 + 1 + r,
                                f"{name}-s{start}-c{c}-r{r}-{via}")
                    if got is None:
                        continue
                    wall = time.time() - t0
                    reps[via].append({
                        "seed": seed0 + 1 + r, "prompts": prompts,
                        "duration_s": round(got["duration"], 2),
                        "output_tok_s": round(got["output_throughput"], 1),
                        "ttft_p50_ms": round(got["median_ttft_ms"], 2),
                        "tpot_p50_ms": round(got["median_tpot_ms"], 3),
                        "failed": got["failed"], **smi.window(t0, time.time()),
                        "cpu_cores": cores(cpu0, tree.seconds(), wall),
                        "engine": engine_steps(eng0, engine_totals(url), wall)})
                    print(json.dumps({"server": name, "via": via, "start": start, "c": c,
                                      **reps[via][-1]}), flush=True)
            for via, got_reps in reps.items():
                tok = [r["output_tok_s"] for r in got_reps]
                rows.append({"model": "llama-8b-shape (dummy weights)",
                             "server": name if via == "front" else f"{name}@{via}",
                             "machine": args.gpu, "via": via,
                             "format": label, "kernel": kernel, "client": "vllm bench serve",
                             "concurrency": c, "input_tokens": n_in, "output_tokens": n_out,
                             "run": args.run, "start": start, "range_ratio": float(RANGE[1]),
                             "order": order, "ready_s": ready,
                             "warmup": {"prompts": c, "output_tok_s": round(
                                 warm["output_throughput"], 1) if warm else None,
                                        "seconds": round(time.time() - w0, 1)},
                             "repeats": got_reps, "output_tok_s": median(tok),
                             "ci95": interval(tok), "spread": spread(tok)})
            save(rows)
        for row in rows:
            row.update(engine_times(engine_log))
        print(f"{name} start {start}: {time.time() - t:.0f} s in all; "
              f"{engine_times(engine_log)}", flush=True)
    finally:
        stop(proc)
    return rows


def summarize(rows: list, base: str = "bf16") -> list:
    """Per server and level over all its starts: median, interval, and the ratio to `base` (its
    interval from every repeat of both); without `base` among the rows, to the first server seen.
    A start order that begins with the format (the protocol's reverse order) still gives x bf16."""
    servers = list(dict.fromkeys(r["server"] for r in rows))
    servers.sort(key=lambda s: s != base)  # the base first, the others in the order seen
    levels = sorted({r["concurrency"] for r in rows})
    machines = sorted({r.get("machine", "-") for r in rows})
    def figs_of(s: str, c: int, on: set | None = None, key: str = "output_tok_s") -> list:
        return [x[key] for r in rows if r["server"] == s and r["concurrency"] == c
                and (on is None or r.get("machine", "-") in on) for x in r["repeats"]
                if x.get(key) is not None]

    tok = {(s, c): figs_of(s, c) for s in servers for c in levels}
    out = []
    for s in servers:
        for c in levels:
            figs = tok[(s, c)]
            if not figs:
                continue
            per_start = [r["output_tok_s"] for r in rows
                         if r["server"] == s and r["concurrency"] == c]
            line = {"server": s, "concurrency": c, "n": len(figs), "output_tok_s": median(figs),
                    "ci95": interval(figs), "spread": spread(figs), "per_start": per_start}
            if busy := figs_of(s, c, key="util_pct"):
                line["gpu_busy_pct"] = [min(busy), median(busy), max(busy)]
            if len(machines) > 1:  # issue 49: the medians of two machines within 5%
                per = {m: median(figs_of(s, c, {m})) for m in machines}
                got = [v for v in per.values() if v]
                line["per_machine"] = per
                line["machines_apart"] = round(max(got) / min(got) - 1, 4) if len(got) > 1 else None
            if s != servers[0]:
                # a ratio only from the machines that ran both servers: a fast machine's bf16
                # against a slow one's format is no ratio (two H100s were 13.5% apart on bf16 at 64)
                both = {m for m in machines if figs_of(s, c, {m}) and figs_of(servers[0], c, {m})}
                if both:
                    line["vs_" + servers[0]] = ratio_interval(figs_of(s, c, both),
                                                              figs_of(servers[0], c, both))
            out.append(line)
    return out


def busy_fit(rows: list, c: int) -> dict:
    """How a level's tokens/s follows the GPU's busy share: each repeat's tok/s relative to its
    server's mean on its machine against its busy share minus that mean (so the fit sees no format
    or machine, only what moved within one); Pearson r and the slope, tok/s share per point; the
    same r for TPOT p50."""
    from statistics import correlation, linear_regression, mean

    groups: dict[tuple, list] = {}
    for r in rows:
        if r["concurrency"] == c:
            groups.setdefault((r.get("machine", "-"), r["server"]), []).extend(
                (x["util_pct"], x["output_tok_s"], x["tpot_p50_ms"]) for x in r["repeats"]
                if x.get("util_pct") is not None)
    dx, dy, dt = [], [], []
    for got in groups.values():
        if len(got) >= 3:
            mu, my, mt = (mean(col) for col in zip(*got))
            dx += [u - mu for u, _, _ in got]
            dy += [y / my - 1 for _, y, _ in got]
            dt += [t / mt - 1 for _, _, t in got]
    if len(dx) < 3:
        return {"concurrency": c, "repeats": len(dx)}
    return {"concurrency": c, "repeats": len(dx), "r": round(correlation(dx, dy), 3),
            "tok_s_per_busy_point": round(linear_regression(dx, dy).slope, 4),
            "tpot_r": round(correlation(dx, dt), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", default="bf16,fp8-static")
    ap.add_argument("--levels", default="1,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=15.0)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--waves", type=int, default=4)
    ap.add_argument("--starts", default=None)
    ap.add_argument("--first-start", type=int, default=0)
    ap.add_argument("--run", default=time.strftime("%Y-%m-%d %H:%M"))
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("QK_SESSION_S", 0)),
                    help="seconds this call may run (session.sh's QK_SESSION_S): a start that "
                         "would not finish in what is left is not begun; 0: no limit")
    ap.add_argument("--start-s", type=float, default=180.0,
                    help="what one start takes before one has been timed (H100/H200: 150-215 s)")
    ap.add_argument("--summarize", nargs="*")
    ap.add_argument("--machine", action="append", default=[],
                    help="FILE=NAME: the machine a --summarize file's rows ran on")
    ap.add_argument("--base", default="bf16", help="the server every ratio is taken against")
    ap.add_argument("--busy", type=int, default=None, metavar="USERS",
                    help="with --summarize: how tok/s follows the GPU's busy share at USERS")
    ap.add_argument("--via", default="front",
                    help="front, direct or front,direct: load-test through quantkit serve's "
                         "front, at vLLM's own port, or both in alternating repeats (--base "
                         "NAME then gives NAME@direct x NAME: the front's cost)")
    args = ap.parse_args()
    args.via = args.via.split(",")
    if not set(args.via) <= {"front", "direct"}:
        ap.error(f"--via: front, direct or front,direct, not {','.join(args.via)}")
    if args.summarize is not None:
        names = dict(m.split("=", 1) for m in args.machine)
        rows = [{**r, "machine": names.get(f, r.get("machine", "-"))}
                for f in args.summarize for r in json.loads(Path(f).read_text())["rows"]]
        print(json.dumps(summarize(rows, args.base) if args.busy is None
                         else busy_fit(rows, args.busy), indent=1))
        return
    args.gpu = gpu()
    args.levels = [int(x) for x in args.levels.split(",")]
    OUT.mkdir(parents=True, exist_ok=True)
    W.mkdir(parents=True, exist_ok=True)
    servers = args.servers.split(",")
    plan = (args.starts.split(",") if args.starts else
            [n for rnd in range(args.restarts) for n in in_round(servers, rnd)])
    smi, rows = Smi(), []
    file = OUT / "h200-protocol.json"
    began, took = time.time(), [args.start_s]
    try:
        for i, name in enumerate(plan):
            start = args.first_start + i
            left = args.budget_s - (time.time() - began)
            if args.budget_s and left < max(took):  # a cut start is device time lost
                print(f"not started: {','.join(plan[i:])}: {left:.0f} s left, a start has taken up "
                      f"to {max(took):.0f} s; next call: --starts {','.join(plan[i:])} "
                      f"--first-start {start}", flush=True)
                break
            t0 = time.time()
            done = list(rows)

            def save(new: list, done: list = done) -> None:
                file.write_text(json.dumps({"rows": done + new,
                                            "summary": summarize(done + new, args.base)}, indent=1))
            rows += run_start(name, args, start, start, smi, save)
            took.append(time.time() - t0)
            save(rows[len(done):])
    finally:
        smi.close()
    print(json.dumps(summarize(rows, args.base), indent=1))


if __name__ == "__main__":
    main()
