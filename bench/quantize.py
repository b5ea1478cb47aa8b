"""Side-by-side benchmark: our GPTQ/AWQ against llm-compressor's oneshot, same inputs, one run.

  quality: the demo model (or any HF folder), one calibration set, perplexity on held-out text
  speed:   a Llama-3-8B-shaped random-weight model, N decoder layers, S samples x T tokens;
           ours timed through quantize(), the function `quantkit quantize` calls
Each invocation measures one (engine, method) pair and writes one JSON file; `table` turns the
JSON files into the markdown rows of docs/BENCHMARKS.md. llm-compressor is imported only here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantkit.engines.hf import model_perplexity, token_windows  # noqa: E402

perplexity = model_perplexity


def scheme(bits: int, group: int, observer: str = "minmax") -> dict:
    return {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": bits, "type": "int", "symmetric": True, "strategy": "group",
        "group_size": group, "observer": observer}}}


def llmc_recipe(method: str, bits: int, group: int, damp: float, act_order: bool,
                observer: str = "minmax"):
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        return GPTQModifier(config_groups=scheme(bits, group, observer), ignore=["lm_head"],
                            dampening_frac=damp, actorder="static" if act_order else None)
    from llmcompressor.modifiers.awq import AWQModifier

    return AWQModifier(config_groups=scheme(bits, group), ignore=["lm_head"])


def llmc_run(model, tok, samples: list[list[int]], method: str, bits: int, group: int,
             damp: float, act_order: bool, observer: str = "minmax") -> None:
    from datasets import Dataset
    from llmcompressor import oneshot

    ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    oneshot(model=model, dataset=ds,
            recipe=llmc_recipe(method, bits, group, damp, act_order, observer),
            processor=tok, num_calibration_samples=len(samples),
            max_seq_length=max(map(len, samples)))


def heldout_windows(tok, path: Path, length: int, n: int) -> torch.Tensor:
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    return token_windows(tok, texts, length, n)


def quality(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.calib import load_calibration_set
    from quantkit.models import resolve_model

    src = resolve_model(args.model).path
    tok = AutoTokenizer.from_pretrained(src)
    dev = torch.device(args.device)
    windows = heldout_windows(tok, Path(args.heldout), args.window, args.windows)
    cset = load_calibration_set(Path(args.calib))
    started = time.time()
    if args.engine == "fp":
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).to(dev)
    elif args.engine == "ours":
        from quantkit.config import QuantizeConfig
        from quantkit.quantize import quantize

        out = Path(args.workdir) / f"ours-{args.method}"
        cfg = QuantizeConfig(method=args.method, bits=args.bits, group_size=args.group,
                             damp=args.damp, device=args.device, clip=args.clip,
                             act_order=args.act_order and args.method == "gptq",
                             hessians=args.hessians, w8_groups=args.w8_groups,
                             awq_scales=args.awq_scales)
        quantize(model=args.model, cfg=cfg, calib=Path(args.calib), out=out, force=True)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(dev)
    else:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).to(dev)
        llmc_run(model, tok, cset.input_ids, args.method, args.bits, args.group, args.damp,
                 args.act_order, args.observer)
    seconds = time.time() - started
    return {"kind": "quality", "engine": args.engine, "method": args.method, "group": args.group,
            "clip": args.clip if args.engine == "ours" else None,
            "observer": args.observer if args.engine == "llmc" else None,
            "hessians": args.hessians if args.engine == "ours" else None,
            "w8_groups": args.w8_groups if args.engine == "ours" else None,
            "awq_scales": args.awq_scales if args.engine == "ours" else None,
            "act_order": args.act_order and args.method == "gptq",
            "samples": len(cset.input_ids), "tokens": sum(map(len, cset.input_ids)),
            "quantize_s": round(seconds, 1), "ppl": round(perplexity(model.eval(), windows, dev), 4),
            "heldout_tokens": int(windows.numel()), "device": str(dev)}


LAYER_PHASES = ("move", "quantize", "experts", "pack", "forward")  # the manifest's per-layer work
_speed_inputs: dict[tuple, tuple[Path, Path]] = {}


def speed_inputs(args) -> tuple[Path, Path]:
    """The speed runs' model and calibration set, made once per process under --workdir: a
    random-weight llama of the asked shape, bf16 (tests/_models.py's random_llama, seed 0), with
    the tokenizer of --tokenizer (default: the tests' tiny tokenizer), and S samples of exactly T
    tokens from the built-in stdlib sources, made by calibrate() as `quantkit calibrate` makes
    them. Both engines read these same two folders."""
    key = (args.hidden, args.mlp, args.heads, args.kv_heads, args.layers, args.samples, args.seq,
           args.tokenizer, args.workdir)
    if key in _speed_inputs:
        return _speed_inputs[key]
    sys.path.insert(0, str(ROOT / "tests"))
    from _models import random_llama, tiny_tokenizer

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig

    work = Path(args.workdir) / "speed"
    tok = Path(args.tokenizer) if args.tokenizer else work / "tok"
    if not args.tokenizer:
        tiny_tokenizer(tok)
    model, calib = work / "model", work / "calib"
    random_llama(model, tok, device=args.device, dtype=torch.bfloat16, hidden_size=args.hidden,
                 intermediate_size=args.mlp, num_attention_heads=args.heads,
                 num_key_value_heads=args.kv_heads, num_hidden_layers=args.layers,
                 vocab_size=49152, max_position_embeddings=max(4096, args.seq))
    calibrate(model=str(model), out=calib, force=True, cfg=CalibrateConfig(
        sources=("builtin:stdlib-docs@0.5", "builtin:stdlib-code@0.5"), samples=args.samples,
        min_tokens=args.seq, max_tokens=args.seq))
    _speed_inputs[key] = model, calib
    return model, calib


def speed(args) -> dict:
    """One engine's quantization of the speed model: ours through quantize(), the function
    `quantkit quantize` calls (load, hash, capture, the layer loop, the checkpoint written), its
    per-layer time from the manifest's phase timings; llm-compressor's oneshot on the model
    loaded from the same folder, with the same calibration samples."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.calib import load_calibration_set

    dev = torch.device(args.device)
    model_dir, calib = speed_inputs(args)
    if args.engine == "ours":
        from quantkit.config import QuantizeConfig
        from quantkit.quantize import quantize

        cfg = QuantizeConfig(method=args.method, bits=args.bits, group_size=args.group,
                             damp=args.damp, device=args.device,
                             act_order=args.act_order and args.method == "gptq")
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.time()
        manifest = quantize(model=str(model_dir), cfg=cfg, calib=calib,
                            out=Path(args.workdir) / "speed" / f"ours-{args.method}", force=True)
        total = time.time() - started
        layer_s = sum(manifest.timings.get(p, 0.0) for p in LAYER_PHASES) / args.layers
        timings = manifest.timings
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(dev)
        tok = AutoTokenizer.from_pretrained(model_dir)  # oneshot re-reads config.json from there
        samples = load_calibration_set(calib).input_ids
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.time()
        llmc_run(model.eval(), tok, samples, args.method, args.bits, args.group, args.damp,
                 args.act_order)
        total = time.time() - started
        layer_s, timings = total / args.layers, None
    return {"kind": "speed", "engine": args.engine, "method": args.method, "layers": args.layers,
            "samples": args.samples, "seq": args.seq, "hidden": args.hidden, "mlp": args.mlp,
            "path": "quantkit.quantize.quantize" if args.engine == "ours" else "llmcompressor.oneshot",
            "total_s": round(total, 2), "per_layer_s": round(layer_s, 2), "timings": timings,
            "est_32_layers_min": round((total + (32 - args.layers) * layer_s) / 60, 2),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
            if dev.type == "cuda" else None, "device": torch.cuda.get_device_name()
            if dev.type == "cuda" else "cpu"}


def table(files: list[str]) -> str:
    rows = [json.loads(Path(f).read_text()) for f in files]
    lines = []
    q = [r for r in rows if r["kind"] == "quality"]
    if q:
        fp = next((r["ppl"] for r in q if r["engine"] == "fp"), None)
        lines += ["| method | engine | act-order | group | samples x tokens | device | quantize s | "
                  "held-out ppl | vs fp |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(q, key=lambda r: (r["method"], r["engine"])):
            vs = f"{(r['ppl'] / fp - 1) * 100:+.2f}%" if fp and r["engine"] != "fp" else ""
            fp32 = r["engine"] == "fp"
            order = "" if fp32 or r["method"] == "awq" else r.get("act_order", "not recorded")
            lines.append(f"| {'fp32' if fp32 else r['method']} | {r['engine']} | {order} | "
                         f"{'' if fp32 else r['group']} | {r['samples']} x "
                         f"{r['tokens'] // r['samples']} | {r['device']} | "
                         f"{'' if fp32 else r['quantize_s']} | {r['ppl']:.3f} | {vs} |")
    s = [r for r in rows if r["kind"] == "speed"]
    if s:
        lines += ["", "| method | engine | layers timed | s / layer | 32 layers, min (est.) | "
                      "peak GPU GiB | ours faster |", "|---|---|---|---|---|---|---|"]
        for r in sorted(s, key=lambda r: (r["method"], r["engine"])):
            other = next((o for o in s if o["method"] == r["method"] and o["engine"] == "llmc"), None)
            ratio = (f"{other['per_layer_s'] / r['per_layer_s']:.1f}x"
                     if other and r["engine"] == "ours" else "")
            lines.append(f"| {r['method']} | {r['engine']} | {r['layers']} | {r['per_layer_s']} | "
                         f"{r['est_32_layers_min']} | {r['peak_gpu_gib']} | {ratio} |")
    return "\n".join(lines)


def heldout(out: Path) -> None:
    """Held-out text of the calibration domain: code and docstrings of a few stdlib packages.

    Build the benchmark's calibration set with `--exclude` on this file so nothing leaks.
    """
    import sysconfig

    from quantkit.sources import _docstrings

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for pkg in ("email", "json", "http", "urllib") for f in (root / pkg).glob("*.py"))
    rows = [{"text": f.read_text(errors="replace")} for f in files if f.stat().st_size]
    rows += [{"text": d} for f in files for d in _docstrings(f)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("part", choices=["quality", "speed", "table", "heldout"])
    p.add_argument("files", nargs="*")
    p.add_argument("--engine", choices=["ours", "llmc", "fp"], default="ours")
    p.add_argument("--method", choices=["gptq", "awq"], default="gptq")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--damp", type=float, default=0.01)
    p.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=True,
                   help="GPTQ static act-order (llm-compressor's default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--calib", default="calib_sets/bench")
    p.add_argument("--heldout", default="bench/.data/heldout.jsonl")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--workdir", default="/tmp/quantkit-bench")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--mlp", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--tokenizer", default="",
                   help="speed: the model's tokenizer folder (default: the tests' tiny tokenizer)")
    p.add_argument("--clip", default="minmax", help="ours: GPTQ scale search, minmax or mse")
    p.add_argument("--observer", default="minmax", help="llmc: its weight observer, minmax or mse")
    p.add_argument("--awq-scales", action="store_true", help="ours, GPTQ: AWQ's scales first")
    p.add_argument("--hessians", default="sequential", help="ours, GPTQ: sequential or original")
    p.add_argument("--w8-groups", default="", help="ours: linear groups kept at 8 bits (N or N%%)")
    p.add_argument("--plan", default="", help="engine:method,... measured in one process")
    p.add_argument("--out", default="-", help="a JSON file, or a folder with --plan")
    args = p.parse_args()
    if args.part == "table":
        print(table(args.files))
        return
    if args.part == "heldout":
        heldout(Path(args.heldout))
        return
    # --plan engine:method[,engine:method...] runs several measurements in this one process
    plan = [tuple(p.split(":")) for p in args.plan.split(",")] if args.plan else [
        (args.engine, args.method)]
    for engine, method in plan:
        args.engine, args.method = engine, method
        result = {"quality": quality, "speed": speed}[args.part](args)
        text = json.dumps(result, indent=2)
        print(text, flush=True)
        if args.out != "-":
            out = Path(args.out)
            if len(plan) > 1 or out.is_dir():
                out.mkdir(parents=True, exist_ok=True)
                out = out / f"{args.part}-{engine}-{method}.json"
            out.write_text(text + "\n")


if __name__ == "__main__":
    main()
