"""Device (H200): GPTQ's column sweep eager against the CUDA-graphed one, on the stacked linears
of one Llama-3-8B layer (q/k/v 6144 x 4096, o 4096 x 4096, gate/up 28672 x 4096, down 4096 x 14336),
act-order, W4 g128; the same result is checked bit for bit. Writes $OUT/gptq-graphs.json.
usage: PYTHONPATH=$PWD python3 bench/h200/gptq_graphs.py"""
import json
import os
import time
from pathlib import Path

import torch

from quantkit.quantize import gptq

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
torch.manual_seed(0)
rows = []
for name, (out_f, in_f) in SHAPES.items():
    x = torch.randn(8192, in_f, device="cuda", dtype=torch.bfloat16) * (torch.rand(in_f, device="cuda") + 0.1)
    H, _ = gptq.accumulate_hessian(None, x, 0)
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02
    res, secs = {}, {}
    for mode in (True, False, True):  # graphed twice: the first call includes the capture
        gptq.USE_CUDA_GRAPHS = mode
        torch.cuda.synchronize()
        t = time.perf_counter()
        res[mode] = gptq.gptq_quantize_weight(w, H, group_size=128, act_order=True)
        torch.cuda.synchronize()
        secs.setdefault(mode, []).append(time.perf_counter() - t)
    same = torch.equal(res[True].q_int, res[False].q_int) and torch.equal(res[True].scale, res[False].scale)
    rows.append({"linears": name, "shape": [out_f, in_f], "eager_s": round(secs[False][0], 3),
                 "graphed_first_s": round(secs[True][0], 3), "graphed_s": round(secs[True][1], 3),
                 "speedup": round(secs[False][0] / secs[True][1], 2), "identical": same})
    print(json.dumps(rows[-1]), flush=True)
Path(os.environ.get("OUT", "."), "gptq-graphs.json").write_text(json.dumps(rows, indent=1))
