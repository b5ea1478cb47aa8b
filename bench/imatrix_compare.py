"""Our importance matrix against llama.cpp's own `llama-imatrix`, side by side, same text.

  python bench/imatrix_compare.py --llama-imatrix PATH/llama-imatrix --calib calib_sets/gguf28

`llama-imatrix` is not part of the llama-cpp-python wheel; build it from that sdist's
vendor/llama.cpp (cmake ... --target llama-imatrix). Both imatrices see the calibration set's
text (llama-imatrix re-tokenizes it into 512-token chunks); each one then drives
llama_model_quantize to Q4_K_M, and llama.cpp measures held-out perplexity of both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantkit.calib import load_calibration_set  # noqa: E402
from quantkit.llamacpp_source import f16_gguf  # noqa: E402
from quantkit.models import resolve_model  # noqa: E402
from quantkit.quantize import gguf as qg  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--llama-imatrix", required=True)
    p.add_argument("--calib", required=True)
    p.add_argument("--heldout", default="bench/.data/heldout.jsonl")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results-gguf/imatrix-compare.json")
    args = p.parse_args()
    src = resolve_model("smollm2-135m").path
    f16, _ = f16_gguf(src)  # the F16 GGUF `quantkit quantize --method gguf` starts from
    cset = load_calibration_set(Path(args.calib))
    work = Path(tempfile.mkdtemp(prefix="imatrix-compare-"))
    text = work / "calib.txt"
    rows = [json.loads(x) for x in (Path(args.calib) / "samples.jsonl").read_text().splitlines()]
    text.write_text("\n".join(r["text"] for r in rows))
    t = time.time()
    theirs = work / "theirs.gguf"
    subprocess.run([args.llama_imatrix, "-m", str(f16), "-f", str(text), "-o", str(theirs),
                    "-c", "512", "--chunks", str(len(rows)), "-t", str(args.threads)],
                   check=True, capture_output=True)
    theirs_s = time.time() - t
    t = time.time()
    ours = work / "ours.gguf"
    info = qg._imatrix(src, cset, f16, ours)
    ours_s = time.time() - t
    a, b = qg.read_imatrix_means(ours), qg.read_imatrix_means(theirs)
    common = sorted(set(a) & set(b))
    corr = [float(np.corrcoef(a[n], b[n])[0, 1]) for n in common]
    held = qg._heldout_text(Path(args.heldout))
    result = {"tokens_ours": info["tokens"], "chunks_theirs": len(rows),
              "seconds_ours": round(ours_s, 1), "seconds_theirs": round(theirs_s, 1),
              "speedup": round(theirs_s / ours_s, 2), "tensors_compared": len(common),
              "only_ours": len(set(a) - set(b)), "only_theirs": len(set(b) - set(a)),
              "correlation_min": round(min(corr), 6), "correlation_mean": round(float(np.mean(corr)), 6)}
    for label, im in (("ours", ours), ("theirs", theirs)):
        out = work / f"q-{label}.gguf"
        qg._llama_quantize(f16, out, "Q4_K_M", im, 0)
        llm = qg._load(out)
        tokens = llm.tokenize(held.encode())[: 512 * 8]
        result[f"ppl_{label}"] = round(qg.llama_perplexity(llm, tokens, 512), 4)
        del llm
    result["ppl_ratio_ours_vs_theirs"] = round(result["ppl_ours"] / result["ppl_theirs"], 5)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
