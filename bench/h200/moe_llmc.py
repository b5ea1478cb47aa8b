"""Device: llm-compressor's GPTQ (W4A16 g128, its MoE defaults: every expert calibrated on all
tokens) on a model folder with quantkit's calibration samples; wall time and peak memory as JSON.
usage: PYTHONPATH=/tmp/llmc:... python3 bench/h200/moe_llmc.py MODEL CALIB OUT.json"""
import json
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from quantize import llmc_run  # noqa: E402

model_dir, calib, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
samples = [json.loads(line)["input_ids"] for line in (calib / "samples.jsonl").read_text().splitlines()]
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

t = time.time()
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(model_dir)
load_s = time.time() - t
torch.cuda.reset_peak_memory_stats()
t = time.time()
llmc_run(model, tok, samples, "gptq", 4, 128, 0.01, True)
total = time.time() - t
json.dump({"engine": "llm-compressor", "load_s": round(load_s, 1), "quantize_s": round(total, 1),
           "layers": model.config.num_hidden_layers, "samples": len(samples),
           "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
           "cpu_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)},
          open(out, "w"), indent=1)
print(open(out).read())
