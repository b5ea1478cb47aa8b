"""Device, vLLM kit installed: vLLM's CUTLASS W4A8 GEMM on the Llama-3.1-8B linears, each tile
schedule it was built with against its own heuristic's choice, and bf16 torch.matmul beside it
(issue 49, item 2: is the 1.09x at one user the heuristic's small grid?). Random int4 weights,
FP8 group scales (g128) and per-row scales, FP8 activations with per-token scales: the tensors
vLLM's CutlassW4A8LinearKernel hands the kernel after loading our W4A8 artifact. Each (M, linear,
schedule) is timed with CUDA events over ITERS calls after a warm-up; a schedule the binary lacks
is skipped. Prints one line per shape and the 32 layers' GEMM time per decode step (heuristic,
best schedule per shape, bf16), and writes OUT.json.
usage: python3 bench/h200/w4a8_tiles.py OUT.json [ITERS]"""
import functools
import json
import sys

import torch

SHAPES = {"qkv": (4096, 6144), "o_proj": (4096, 4096), "gate_up": (4096, 28672),
          "down": (14336, 4096)}  # (K in, N out) of one Llama-3.1-8B layer, TP1
TOKENS = (1, 8, 32, 64)
TILES = [f"{t}_{c}" for t in ("128x16", "128x32", "128x64", "128x128", "128x256",
                              "256x16", "256x32", "256x64", "256x128")
         for c in ("1x1x1", "2x1x1")]
LAYERS = 32


def timed(fn, iters: int) -> float:
    """Median microseconds of one call over `iters`, CUDA events around each."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    from vllm import _custom_ops as ops

    out, iters = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    dev, fp8 = "cuda", torch.float8_e4m3fn
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (k, n) in SHAPES.items():
        # int4 values packed 8 to an int32 along K, [K/8, N] (the packed layout after loading)
        packed = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32, device=dev,
                               generator=gen)
        b_q = ops.cutlass_encode_and_reorder_int4b(packed.t().contiguous().t())
        group = (torch.rand(k // 128, n, device=dev, generator=gen) * 0.5 + 0.5).to(fp8)
        b_s = ops.cutlass_pack_scale_fp8(group.contiguous())
        chan = torch.rand(n, 1, device=dev, generator=gen, dtype=torch.float32) * 1e-2
        w16 = torch.randn(k, n, device=dev, dtype=torch.bfloat16, generator=gen)
        for m in TOKENS:
            a = (torch.randn(m, k, device=dev, generator=gen)).to(fp8)
            a_s = torch.rand(m, 1, device=dev, generator=gen, dtype=torch.float32)
            x16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
            w4a8 = functools.partial(ops.cutlass_w4a8_mm, a=a, b_q=b_q, b_group_scales=b_s,
                                     b_group_size=128, b_channel_scales=chan, a_token_scales=a_s)
            row = {"linear": name, "k": k, "n": n, "m": m,
                   "heuristic_us": timed(w4a8, iters),
                   "bf16_us": timed(functools.partial(torch.matmul, x16, w16), iters),
                   "tiles_us": {}}
            for tile in TILES:
                try:
                    row["tiles_us"][tile] = timed(functools.partial(w4a8, maybe_schedule=tile),
                                                  iters)
                except RuntimeError as exc:  # a schedule this binary was not built with
                    if "Unknown W4A8 schedule" not in str(exc):
                        raise
            best = min(row["tiles_us"].items(), key=lambda kv: kv[1],
                       default=("heuristic", row["heuristic_us"]))
            row["best_tile"], row["best_us"] = best
            # bytes the GEMM must read: int4 weights, FP8 group scales packed 8 bytes each
            weight_bytes = k * n / 2 + (k // 128) * n * 8
            row["heuristic_gbps"] = weight_bytes / row["heuristic_us"] / 1e3
            rows.append(row)
            print(f"{name:8s} M={m:3d}: heuristic {row['heuristic_us']:7.1f} us "
                  f"({row['heuristic_gbps']:5.0f} GB/s), best {row['best_tile']} "
                  f"{row['best_us']:7.1f} us, bf16 {row['bf16_us']:7.1f} us", flush=True)
    per_step = {}
    for m in TOKENS:
        mine = [r for r in rows if r["m"] == m]
        per_step[m] = {key: round(sum(r[key] for r in mine) * LAYERS / 1e3, 3)
                       for key in ("heuristic_us", "best_us", "bf16_us")}
        print(f"M={m:3d}, {LAYERS} layers' GEMMs a decode step (ms): heuristic "
              f"{per_step[m]['heuristic_us']}, best tiles {per_step[m]['best_us']}, "
              f"bf16 {per_step[m]['bf16_us']}", flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "iters": iters, "rows": rows,
               "per_step_ms": per_step}, open(out, "w"), indent=2)


if __name__ == "__main__":
    main()
