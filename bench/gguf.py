"""GGUF benchmark on the demo model: F16 vs Q4_K_M without and with our importance matrix.

Perplexity from llama.cpp itself on held-out text (bench/.data/heldout.jsonl, see
`python bench/quantize.py heldout`), file sizes, bits per weight and the time of each step.
The calibration set should exclude the held-out file (quantkit calibrate --exclude).

  python bench/gguf.py --calib calib_sets/gguf28 --out bench/results-gguf
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantkit.config import QuantizeConfig  # noqa: E402
from quantkit.quantize import quantize  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--calib", required=True)
    p.add_argument("--heldout", default="bench/.data/heldout.jsonl")
    p.add_argument("--quant-type", default="Q4_K_M")
    p.add_argument("--out", default="bench/results-gguf")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="quantkit-gguf-bench-"))
    rows = []
    for use in (False, True):
        cfg = QuantizeConfig(method="gguf", quant_type=args.quant_type, imatrix=use,
                             heldout=args.heldout)
        m = quantize(model=args.model, cfg=cfg, calib=Path(args.calib),
                     out=work / f"im-{use}").to_dict()
        rows.append(m)
        (out / f"gguf-{args.quant_type}-imatrix-{use}.json").write_text(json.dumps(m, indent=2))
    shutil.rmtree(work)
    base = rows[0]
    print("| file | imatrix | size MiB | bits/weight | fallback tensors | held-out ppl | "
          "imatrix s | quantize s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| F16 | | {base['baseline_f16']['size_bytes'] / 2**20:.1f} | 16 | | "
          f"{base['verification']['ppl_f16']} | | |")
    for m in rows:
        im = m["imatrix"]
        print(f"| {args.quant_type} | {'ours, ' + str(im['tokens']) + ' tokens' if im else 'none'}"
              f" | {m['size_bytes']['after'] / 2**20:.1f} | {m['bits_per_weight']} | "
              f"{m['fallback_tensors']} of {m['tensors']} | {m['verification']['ppl_quantized']} | "
              f"{m['timings'].get('imatrix_s', '')} | {m['timings']['quantize_s']} |")


if __name__ == "__main__":
    main()
