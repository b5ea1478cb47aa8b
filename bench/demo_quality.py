"""Two quality claims on the demo model, measured through the CLI the user runs (they were tests
of the end-to-end tier; at 3-9 minutes each on 2 cores they are benchmarks, figures in
docs/BENCHMARKS.md, "Quality per format on the demo model"):

  gptq-g64   `quantkit quantize --method gptq --group-size 64` (32 x 512 calibration tokens):
             held-out perplexity against fp32 and round-to-nearest at the same grid
             (the claim: under +30% over fp32, and below round-to-nearest)
  imatrix    `quantkit quantize --method gguf` Q4_K_M with and without the importance matrix
             (64 x 512): llama.cpp's held-out perplexity of each (the claim: the matrix helps)

  python bench/demo_quality.py gptq-g64 imatrix [--out FILE.json]
Held-out text: the standard library's email/ and json/ packages, excluded from calibration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def cli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "quantkit", "-q", *args], capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"quantkit {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def heldout(package: str, work: Path) -> tuple[list[str], Path]:
    texts = [f.read_text() for f in sorted((STDLIB / package).glob("*.py")) if f.stat().st_size]
    path = work / f"heldout-{package}.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts, path


def calibrate(work: Path, samples: int, exclude: Path) -> Path:
    out = work / f"calib-{samples}"
    cli("calibrate", "smollm2-135m", "--source", "builtin:stdlib-docs@0.5", "--source",
        "builtin:stdlib-code@0.5", "--samples", str(samples), "--min-tokens", "512",
        "--max-tokens", "512", "--exclude", str(exclude), "--out", str(out))
    return out


def gptq_g64(work: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.engines.hf import model_perplexity, token_windows
    from quantkit.models import resolve_model
    from quantkit.quantize.numerics import fake_quantize

    texts, path = heldout("email", work)
    out = work / "gptq-g64"
    cli("quantize", "smollm2-135m", "--method", "gptq", "--calib", str(calibrate(work, 32, path)),
        "--group-size", "64", "--out", str(out))
    demo = resolve_model("smollm2-135m").path
    windows = token_windows(AutoTokenizer.from_pretrained(demo), texts, 512, 16)

    def load(p: Path) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()

    fp = model_perplexity(load(demo), windows)
    ours = model_perplexity(load(out), windows)
    rtn_model = load(demo)
    for mod in rtn_model.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.data = fake_quantize(mod.weight.data, 4, 64, True)
    rtn = model_perplexity(rtn_model, windows)
    return {"fp32": fp, "gptq_g64": ours, "rtn_g64": rtn, "gptq_increase": ours / fp - 1,
            "rtn_increase": rtn / fp - 1, "claim_holds": ours < rtn and ours < 1.30 * fp}


def imatrix(work: Path) -> dict:
    _, path = heldout("json", work)
    calib, ppl = calibrate(work, 64, path), {}
    for flag in ("--imatrix", "--no-imatrix"):
        out = work / flag.strip("-")
        cli("quantize", "smollm2-135m", "--method", "gguf", "--calib", str(calib), flag,
            "--heldout", str(path), "--out", str(out))
        ppl[flag] = json.loads((out / "quantkit.json").read_text())["verification"]
    return {"f16": ppl["--imatrix"]["ppl_f16"], "q4_k_m_imatrix": ppl["--imatrix"]["ppl_quantized"],
            "q4_k_m_plain": ppl["--no-imatrix"]["ppl_quantized"],
            "claim_holds": ppl["--imatrix"]["ppl_quantized"] < ppl["--no-imatrix"]["ppl_quantized"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="+", choices=["gptq-g64", "imatrix"])
    ap.add_argument("--out")
    args = ap.parse_args()
    found = {"date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory(prefix="demo-quality-") as tmp:
        for what in args.what:
            t = time.time()
            found[what] = {**(gptq_g64 if what == "gptq-g64" else imatrix)(Path(tmp)),
                           "seconds": round(time.time() - t, 1)}
            print(json.dumps({what: found[what]}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
