"""Validation-shaped CPU work on an idle machine and beside one other CPU-bound process.

Issue 11 item 10: the demo's validation took 196 s idle and 1223 s with one other CPU-bound
process on this 2-core machine (6x for a 2x share of the CPU). This times the same kind of work
in fresh subprocesses, one condition after another:

  a  idle, threads = all cores (the old behaviour, QUANTKIT_THREADS=os.cpu_count())
  b  one other CPU-bound process, threads = all cores (old)
  c  one other CPU-bound process, quantkit's default threads (idle_cores decides)
  d  idle, quantkit's default threads
  e  one other CPU-bound process, threads = all cores, OMP_WAIT_POLICY=PASSIVE

The "other process" is `python -c "while True: pass"`, started a second before the run and
killed after it. The work, timed after the model is loaded through quantkit's own engine:
`token_nlls` over 8 windows of 512 tokens (perplexity, domain), `loglikelihood` of 16 contexts
x 4 one-token answers (MMLU) and `generate_many` of 8 chat prompts x 32 greedy tokens (sampling,
HumanEval). The text is the stdlib email package's source. Each condition runs --repeats times
(the order reversed on every other pass); the table shows the median. Before each run it waits
(--quiet-wait, up to 300 s) for other processes to go quiet, and it reports the CPU that processes
other than its own used during each run: a run beside someone's test suite shows there.

The llama.cpp engine runs the same on an F16 GGUF (--gguf, or the cached
~/.cache/quantkit/gguf/*/model-f16.gguf) when llama_cpp imports and a file exists.

  python bench/busy_cpu.py --out bench/results-cpu/busy_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL = str(os.cpu_count() or 1)
CONDITIONS = {  # name: (label, other CPU-bound process, extra environment)
    "a": ("idle, all cores (old)", False, {"QUANTKIT_THREADS": ALL}),
    "b": ("busy, all cores (old)", True, {"QUANTKIT_THREADS": ALL}),
    "c": ("busy, quantkit default (new)", True, {}),
    "d": ("idle, quantkit default (new)", False, {}),
    "e": ("busy, all cores, OMP_WAIT_POLICY=PASSIVE", True,
          {"QUANTKIT_THREADS": ALL, "OMP_WAIT_POLICY": "PASSIVE"}),
}
CLEAN_ENV = ("QUANTKIT_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
             "MKL_NUM_THREADS", "OMP_PROC_BIND")
PROMPTS = [f"In two sentences, what does the Python module {m} do?" for m in
           ("json", "email", "http.client", "urllib.parse", "itertools", "pathlib", "re",
            "subprocess")]


def stdlib_text() -> str:
    import email

    root = Path(email.__file__).parent
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace")
                       for p in sorted(root.rglob("*.py")))


def worker(kind: str, gguf: str, windows: int, contexts: int, prompts: int, new_tokens: int) -> dict:
    """Load the demo model in this process and time the work; returns the measurements."""
    t0 = time.perf_counter()
    from quantkit.engines import engine_for

    if kind == "hf":
        from quantkit.models import resolve_model

        path = resolve_model("smollm2-135m").path
    else:
        path = Path(gguf)
    e = engine_for(path)
    load_s = time.perf_counter() - t0
    if kind == "hf":
        import torch

        threads = torch.get_num_threads()
    else:
        # generation runs on n_threads, prompt evaluation and scoring on n_threads_batch
        threads = f"{e.llm.n_threads} (batch {e.llm.n_threads_batch})"
    ids = e.encode(stdlib_text())
    need = windows * 512 + contexts * 400
    if len(ids) < need:
        raise SystemExit(f"only {len(ids)} tokens of text, need {need}")
    w = 512 - len(e.prefix)
    parts = {}
    c0, t = time.process_time(), time.perf_counter()
    for i in range(windows):
        e.token_nlls(ids[i * w:(i + 1) * w])
    parts["nll_s"] = time.perf_counter() - t
    t = time.perf_counter()
    base = windows * w
    answers = [e.encode(" " + a) for a in "ABCD"]
    reqs = [(ids[base + i * 400: base + (i + 1) * 400], a) for i in range(contexts) for a in answers]
    e.loglikelihood(reqs)
    parts["loglik_s"] = time.perf_counter() - t
    t = time.perf_counter()
    e.generate_many([e.chat_prompt(p) for p in PROMPTS[:prompts]], max_tokens=new_tokens,
                    temperature=0.0)
    parts["generate_s"] = time.perf_counter() - t
    work_s = sum(parts.values())
    cpu_s = time.process_time() - c0
    e.close()
    return {"load_s": round(load_s, 2), "work_s": round(work_s, 2), "cpu_s": round(cpu_s, 2),
            "threads": threads, **{k: round(v, 2) for k, v in parts.items()}}


def background_busy(sample_s: float = 1.0) -> float:
    """Cores' worth of CPU that other processes use now."""
    import psutil

    return round(sum(psutil.cpu_percent(interval=sample_s, percpu=True)) / 100, 2)


def wait_quiet(limit_s: float, below: float) -> tuple[float, float]:
    """Wait up to `limit_s` for other processes to use less than `below` cores; (cores, waited s)."""
    t = time.perf_counter()
    busy = background_busy()
    while busy >= below and time.perf_counter() - t < limit_s:
        time.sleep(4.0)
        busy = background_busy()
    return busy, round(time.perf_counter() - t, 1)


def busy_cpu_s() -> float:
    """CPU seconds all processes have used since boot (every core, not idle or waiting on I/O)."""
    import psutil

    ct = psutil.cpu_times()
    return sum(ct) - ct.idle - getattr(ct, "iowait", 0.0) - getattr(ct, "guest", 0.0) \
        - getattr(ct, "guest_nice", 0.0)


def children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime + me.ru_utime + me.ru_stime


def run_one(kind: str, cond: str, args: argparse.Namespace) -> dict:
    import psutil

    label, busy, extra = CONDITIONS[cond]
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env.update(extra)
    before, waited = wait_quiet(args.quiet_wait, args.quiet_below)
    all0, ours0, t0 = busy_cpu_s(), children_cpu_s(), time.perf_counter()
    hog = None
    if busy:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)
    cmd = [sys.executable, __file__, "--worker", kind, "--gguf", args.gguf or "",
           "--windows", str(args.windows), "--contexts", str(args.contexts),
           "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        done = None
    finally:
        wall = time.perf_counter() - t
        hog_cpu = None
        if hog is not None:
            try:
                ct = psutil.Process(hog.pid).cpu_times()
                hog_cpu = ct.user + ct.system
            except psutil.Error:
                pass
            hog.kill()
            hog.wait()
    span = time.perf_counter() - t0
    # CPU that processes other than this benchmark's used while the run lasted, in cores
    others = round(max(0.0, busy_cpu_s() - all0 - (children_cpu_s() - ours0)) / span, 2)
    if done is None:  # counted as the limit: a lower bound of the real time
        row = {"load_s": None, "work_s": float(args.timeout), "cpu_s": None, "threads": None,
               "timed_out": True}
    else:
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"worker failed ({kind}, {cond}): {done.stderr[-2000:]}")
        row = json.loads(lines[-1][len("RESULT "):])
    # the other process ran from 1 s before the worker started until it ended
    hog_share = round(hog_cpu / (wall + 1.0), 2) if hog_cpu is not None else None
    row.update(engine=kind, condition=cond, label=label, busy=busy,
               env={k: v for k, v in extra.items()}, background_busy_cores=before,
               waited_for_quiet_s=waited, others_during_run_cores=others,
               other_process_cores=hog_share, process_wall_s=round(wall, 2))
    return row


def ratio(med: dict, x: str, y: str) -> float | None:
    if x in med and y in med:
        return round(med[x]["work_s"] / med[y]["work_s"], 2)
    return None


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for kind in sorted({r["engine"] for r in rows}):
        med = {}
        for cond in CONDITIONS:
            got = [r for r in rows if r["engine"] == kind and r["condition"] == cond]
            if got:
                med[cond] = {k: statistics.median([r[k] for r in got if r.get(k) is not None]
                                                  or [float("nan")])
                             for k in ("work_s", "cpu_s", "load_s", "nll_s", "loglik_s",
                                       "generate_s")}
                med[cond]["runs"] = [r["work_s"] for r in got]
                med[cond]["timed_out"] = sum(bool(r.get("timed_out")) for r in got)
                med[cond]["threads"] = sorted({r["threads"] for r in got if r["threads"]})
                med[cond]["background_busy_cores"] = [r["background_busy_cores"] for r in got]
                med[cond]["others_during_run_cores"] = [r["others_during_run_cores"] for r in got]
                med[cond]["other_process_cores"] = [r["other_process_cores"] for r in got]

        out[kind] = {"median": med, "ratios": {
            "old busy/idle (b/a)": ratio(med, "b", "a"),
            "new busy/idle (c/d)": ratio(med, "c", "d"),
            "new busy / old idle (c/a)": ratio(med, "c", "a"),
            "PASSIVE busy / old idle (e/a)": ratio(med, "e", "a"),
            "new idle / old idle (d/a)": ratio(med, "d", "a")}}
    return out


def table(summary: dict) -> str:
    lines = ["| engine | condition | threads | work s, each run | median s | CPU s of the run "
             "| other process got, cores | others' use during the run, cores | nll / loglik / generate s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, s in summary.items():
        for cond, m in s["median"].items():
            other = ", ".join(f"{x:.2f}" for x in m["other_process_cores"] if x is not None)
            lines.append(f"| {kind} | {cond}: {CONDITIONS[cond][0]} | "
                         f"{'/'.join(map(str, m['threads']))} | "
                         f"{', '.join(f'{x:.1f}' for x in m['runs'])}"
                         f"{' (timed out)' * bool(m['timed_out'])} | "
                         f"{m['work_s']:.1f} | "
                         f"{m['cpu_s']:.1f} | {other} | "
                         f"{', '.join(f'{x:.2f}' for x in m['others_during_run_cores'])} | "
                         f"{m['nll_s']:.1f} / {m['loglik_s']:.1f} / {m['generate_s']:.1f} |")
    lines.append("")
    for kind, s in summary.items():
        lines.append(f"{kind}: " + "; ".join(f"{k} {v}x" for k, v in s["ratios"].items()
                                             if v is not None))
    return "\n".join(lines)


def find_gguf(given: str) -> str:
    if given:
        return given if Path(given).is_file() else ""
    found = sorted(Path("~/.cache/quantkit/gguf").expanduser().glob("*/model-f16.gguf"))
    return str(found[0]) if found else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the runs and medians as JSON here")
    p.add_argument("--conditions", default="abcde", help="which of a-e to run (default all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--engines", default="hf,llamacpp", help="hf, llamacpp or both")
    p.add_argument("--gguf", default="", help="F16 GGUF for the llama.cpp engine")
    p.add_argument("--windows", type=int, default=8, help="512-token windows scored")
    p.add_argument("--contexts", type=int, default=16, help="400-token contexts x 4 answers")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--quiet-wait", type=float, default=300,
                   help="seconds to wait before each run for other processes to go quiet")
    p.add_argument("--quiet-below", type=float, default=0.15,
                   help="'quiet': other processes use fewer cores than this")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        res = worker(args.worker, args.gguf, args.windows, args.contexts, args.prompts,
                     args.new_tokens)
        print("RESULT " + json.dumps(res), flush=True)
        return

    kinds = []
    for kind in args.engines.split(","):
        if kind == "hf":
            kinds.append("hf")
        elif kind == "llamacpp":
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                print("llama_cpp does not import: skipping the llama.cpp engine", file=sys.stderr)
                continue
            args.gguf = find_gguf(args.gguf)
            if not args.gguf:
                print("no F16 GGUF (--gguf or ~/.cache/quantkit/gguf/*/model-f16.gguf): "
                      "skipping the llama.cpp engine", file=sys.stderr)
                continue
            kinds.append("llamacpp")
    conds = [c for c in args.conditions if c in CONDITIONS]
    rows: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for kind in kinds:
        for rep in range(args.repeats):
            for cond in (conds if rep % 2 == 0 else conds[::-1]):
                row = run_one(kind, cond, args)
                row["repeat"] = rep
                rows.append(row)
                print(f"[{kind} {cond} #{rep + 1}] {row['label']}: work {row['work_s']} s, "
                      f"{row['threads']} threads, cpu {row['cpu_s']} s, load {row['load_s']} s, "
                      f"others before {row['background_busy_cores']} / during "
                      f"{row['others_during_run_cores']} cores", file=sys.stderr,
                      flush=True)
                if args.out:  # after every run, so a stopped measurement keeps what it has
                    save(Path(args.out), started, rows, args, done=False)
    print(table(summarize(rows)))
    if args.out:
        save(Path(args.out), started, rows, args, done=True)


def save(out: Path, started: str, rows: list[dict], args: argparse.Namespace, done: bool) -> None:
    import platform

    import torch

    meta = {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S") if done else None,
            "command": " ".join([Path(sys.executable).name] + sys.argv),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "torch_parallel": torch.__config__.parallel_info(),
            "python": platform.python_version(), "gguf": args.gguf or None}
    try:
        import llama_cpp

        meta["llama_cpp"] = llama_cpp.__version__
    except ImportError:
        pass
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "summary": summarize(rows), "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
