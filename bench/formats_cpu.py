"""CPU, the demo model: each weight/activation format's quality next to the others, one run.

Quantizes SmolLM2-135M-Instruct with `quantkit.quantize.quantize` (the CLI's function) from one
calibration set (builtin stdlib docs + code, 32 x 512 tokens, the held-out text excluded), then
scores every artifact as `quantkit validate` loads it (transformers; compressed-tensors' CPU fake
quantization of FP8 weights and activations, quantkit's emulation of vLLM's FP8 KV cache) on
held-out text (the stdlib's email package, 16 x 512 tokens): perplexity and the mean per-token KL
from the original's next-token distribution; and the long_context task's retrieval accuracy
(12 documents up to the CPU engine's 2048-token context). W4A8 is absent: vLLM's W4A8 kernel
needs fused linears in multiples of 128 and the demo model's are 576 and 192 wide (`quantkit
quantize` refuses it with exit 2).

usage: python bench/formats_cpu.py OUT.json [NAME ...]   (NAME: only the formats whose name
contains it; their rows replace those of OUT.json)
"""

from __future__ import annotations

import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantkit.calib import calibrate  # noqa: E402
from quantkit.config import CalibrateConfig, QuantizeConfig  # noqa: E402
from quantkit.engines.hf import token_windows  # noqa: E402
from quantkit.models import resolve_model  # noqa: E402
from quantkit.quantize import quantize  # noqa: E402

FORMATS = {
    "W4A16 g64 (GPTQ)": QuantizeConfig(method="gptq", group_size=64),
    "W8A16 per channel (GPTQ)": QuantizeConfig(method="gptq", bits=8, group_size=-1),
    "FP8 (per-token activations)": QuantizeConfig(method="fp8"),
    "FP8-static": QuantizeConfig(method="fp8", static=True),
    "FP8 + FP8 KV cache": QuantizeConfig(method="fp8", kv_cache="fp8"),
    "W4A16 g64 + FP8 KV cache": QuantizeConfig(method="gptq", group_size=64, kv_cache="fp8"),
}
LONG_SAMPLES = 12  # long_context documents: 512, 1024 and 2048 tokens, facts at 10/50/90%


def scores(path: Path, windows: torch.Tensor, ref: list[torch.Tensor] | None
           ) -> tuple[float, float, list[torch.Tensor]]:
    """(perplexity, mean KL from `ref`, this model's log-probabilities per window)."""
    from transformers import AutoModelForCausalLM

    from quantkit.kvcache import emulate_fp8_kv

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    emulate_fp8_kv(model, path)  # an FP8 KV cache's scales in the checkpoint: as served
    nll, n, kl, logps = 0.0, 0, 0.0, []
    with torch.no_grad():
        for i, row in enumerate(windows):
            lp = model(input_ids=row[None]).logits[0].float().log_softmax(-1)
            logps.append(lp)
            nll -= float(lp[:-1].gather(1, row[1:, None]).sum())
            n += len(row) - 1
            if ref is not None:
                kl += float((ref[i].exp() * (ref[i] - lp)).sum(-1).mean())
    return float(torch.exp(torch.tensor(nll / n))), kl / len(windows), logps


def long_context(path: Path) -> float:
    from quantkit.engines.hf import TransformersEngine
    from quantkit.validate.longctx import build_items, filler, run_long_context

    engine = TransformersEngine(path)
    items = build_items(engine.encode, engine.context_length, filler(None), LONG_SAMPLES, 0)
    return float(run_long_context(engine, items)["accuracy"])


def main() -> None:
    from transformers import AutoTokenizer

    out, only = Path(sys.argv[1]), sys.argv[2:]
    demo = resolve_model("smollm2-135m").path
    held = [f.read_text() for f in sorted((Path(sysconfig.get_paths()["stdlib"]) / "email")
                                          .glob("*.py")) if f.stat().st_size]
    windows = token_windows(AutoTokenizer.from_pretrained(demo), held, 512, 16)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        heldout = work / "heldout.jsonl"
        heldout.write_text("".join(json.dumps({"text": t}) + "\n" for t in held))
        calibrate(model="smollm2-135m", out=work / "calib", cfg=CalibrateConfig(
            sources=("builtin:stdlib-docs@0.5", "builtin:stdlib-code@0.5"), samples=32,
            min_tokens=512, max_tokens=512, exclude=(str(heldout),)))
        ppl, _, ref = scores(demo, windows, None)
        rows.append({"format": "original (bf16 weights, fp32 compute)", "perplexity": round(ppl, 4),
                     "kl": 0.0, "long_context": long_context(demo),
                     "linear_bits_per_weight": 16.0, "quantize_s": 0.0})
        for n, (name, cfg) in enumerate(FORMATS.items()):
            if only and not any(o in name for o in only):
                continue
            t = time.time()
            manifest = quantize(model="smollm2-135m", cfg=cfg, calib=work / "calib",
                                out=work / f"format-{n}")
            took = time.time() - t
            ppl, kl, _ = scores(work / f"format-{n}", windows, ref)
            rows.append({"format": name, "perplexity": round(ppl, 4), "kl": round(kl, 5),
                         "long_context": long_context(work / f"format-{n}"),
                         "linear_bits_per_weight": manifest.linear_bits_per_weight,
                         "quantize_s": round(took, 1)})
            print(json.dumps(rows[-1]), flush=True)
    if only and out.exists():  # the other formats' rows as they were
        new = {r["format"] for r in rows[1:]}
        rows = [r for r in json.loads(out.read_text())["rows"] if r["format"] not in new] + rows[1:]
    out.write_text(json.dumps({"model": "smollm2-135m", "windows": "16 x 512 (stdlib email)",
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
