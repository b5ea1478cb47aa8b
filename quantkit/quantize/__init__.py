"""`quantize()`: a model and a calibration set -> a 4/8-bit compressed-tensors artifact (GPTQ or AWQ)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.errors import BadInput
from quantkit.fsutil import check_output_dir, dumps

METHODS = ("gptq", "awq", "gguf")
GROUP_SIZES = (32, 64, 128, 256)


def quantize(*, model: str, method: str, calib: Path, out: Path, bits: int = 4,
             group_size: int = 128, sym: bool = True, act_order: bool | None = None,
             damp: float = 0.01, device: str = "auto", resume: bool = False,
             force: bool = False, batch_tokens: int | None = None, quant_type: str = "Q4_K_M",
             imatrix: bool = True, threads: int = 0,
             heldout: Path | None = None) -> dict[str, Any]:
    """Quantize `model` with `method` (gptq, awq: layer by layer; gguf: through llama.cpp);
    write the artifact to `out`; return its manifest."""
    from quantkit.quantize.layers import QuantSpec

    started = time.time()
    if method == "gguf":
        from quantkit.quantize.gguf import quantize_gguf

        return quantize_gguf(model=model, calib=calib, out=out, quant_type=quant_type,
                             use_imatrix=imatrix, threads=threads, heldout=heldout, force=force)
    if act_order is None:  # GPTQ's default, as llm-compressor's: static act-order
        act_order = method == "gptq"
    _check_options(method, bits, group_size, damp, act_order)
    spec = QuantSpec(method, bits, group_size, sym, act_order, damp)
    check_output_dir(out, force)
    from quantkit.models import weights_sha256
    from quantkit.quantize.families import family_for

    ref, info, cset = preflight_calibration(model, calib)
    family = family_for(info["model_type"])
    _check_group_size(info["linear_shapes"], family.linears, group_size)
    dev = _device(device)
    if not sym:
        console.warn("--asym checkpoints load in vLLM, but transformers with compressed-tensors "
                     "0.20 rejects their packed zero points (upstream bug); validate with --sym")
    n_tokens = sum(map(len, cset.input_ids))
    _check_memory(info, n_tokens, dev)

    import torch

    from quantkit.models import load_model
    from quantkit.quantize.checkpoint import finish, load_layer, save_layer, start_partial
    from quantkit.quantize.layers import LAYER_QUANTIZERS, run_layer

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    source_sha = weights_sha256(ref.path)
    dtype = info["dtypes"] and max(info["dtypes"], key=info["dtypes"].get)
    lm = load_model(ref.path, dtype={"F32": "float32", "F16": "float16"}.get(dtype, "bfloat16"))
    layers = lm.get_submodule(family.layers_attr)
    partial = out.parent / f".{out.name}.partial"
    key = {"source_sha256": source_sha, "calib_sha256": cset.sha256, "spec": spec.__dict__}
    done = start_partial(partial, key, resume)
    if done:
        console.log(f"resuming: {done} of {len(layers)} layers already quantized")
    batches = capture_inputs(lm, family.layers_attr, cset.input_ids, dev,
                             batch_tokens or (16384 if dev.type == "cuda" else 4096))
    errors: dict[str, dict[str, float]] = {}
    for i in console.progress(range(len(layers)), f"{method} layers", total=len(layers)):
        layer = layers[i].to(dev)
        if i < done:
            load_layer(partial, i, family.layers_attr, layer, family, spec)
        else:
            results = LAYER_QUANTIZERS[method](layer, family, batches, spec)
            save_layer(partial, i, family.layers_attr, layer, family, results, spec)
            errors[str(i)] = {n: r.error for n, r in results.items()}
            worst = max(errors[str(i)].items(), key=lambda kv: kv[1])
            console.log(f"layer {i}: worst relative output error {worst[1]:.2e} ({worst[0]})")
        outs = run_layer(layer, batches)
        batches = [(o, kw) for o, (_, kw) in zip(outs, batches)]
        layer.to("cpu")
    del batches
    finish(partial, lm, family, ref.path, spec, len(layers))
    from quantkit.artifact import MANIFEST, folder_size, library_versions
    from quantkit.quantize.checkpoint import read_state

    manifest = {
        "schema_version": 1, "checkpoint": "compressed-tensors", "format": "pack-quantized",
        "source": {"spec": model, "path": str(ref.path), "weights_sha256": source_sha,
                   "architecture": info["architecture"], "parameters": info["parameters"]},
        "calibration": {"path": str(calib), "samples_sha256": cset.sha256,
                        "samples": len(cset.input_ids), "tokens": n_tokens},
        "method": method, "parameters": {**spec.__dict__, "device": dev.type},
        "layer_errors": read_state(partial)["errors"],
        "versions": library_versions("torch", "transformers", "compressed-tensors"),
        "wall_time_s": round(time.time() - started, 2),
        "peak_memory": _peak_memory(dev),
        "size_bytes": {"before": folder_size(ref.path), "after": folder_size(partial)},
    }
    (partial / MANIFEST).write_text(dumps(manifest))
    (partial / "resume.json").unlink()
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return manifest


def preflight_calibration(model: str, calib: Path) -> tuple[Any, dict[str, Any], Any]:
    """Resolve the model, refuse an already quantized one, and check that the calibration set
    was tokenized by this model's tokenizer. Returns (model ref, inspect info, calibration set)."""
    from quantkit.calib import load_calibration_set
    from quantkit.inspect import inspect_model
    from quantkit.models import load_tokenizer, resolve_model, tokenizer_fingerprint

    cset = load_calibration_set(Path(calib))
    ref = resolve_model(model)
    info = inspect_model(ref.path)
    if info["quantized"]:
        raise BadInput(f"model {model} is already quantized ({info['quantization']})",
                       "quantize the original full-precision model")
    fingerprint = tokenizer_fingerprint(load_tokenizer(ref.path))
    if cset.manifest.get("tokenizer", {}).get("fingerprint") != fingerprint:
        raise BadInput(f"calibration set {calib} was made with another tokenizer "
                       f"({cset.manifest.get('model')}) than {model}",
                       f"rebuild it: quantkit calibrate {model} ... --out {calib} --force")
    return ref, info, cset


def length_batches(samples: list[list[int]], batch_tokens: int) -> Iterator[list[list[int]]]:
    """Samples of equal length in batches of about `batch_tokens` tokens (no padding needed)."""
    by_len: dict[int, list[list[int]]] = {}
    for ids in samples:
        by_len.setdefault(len(ids), []).append(ids)
    for length in sorted(by_len):
        group, per = by_len[length], max(1, batch_tokens // length)
        for j in range(0, len(group), per):
            yield group[j:j + per]


def capture_inputs(lm: Any, layers_attr: str, samples: list[list[int]], device: Any,
                   batch_tokens: int) -> list[tuple[Any, dict[str, Any]]]:
    """Run the model up to its first decoder layer; keep that layer's inputs for every batch.

    Samples of equal length are batched (no padding, so no attention mask is needed).
    """
    import torch

    from quantkit.quantize.layers import _Stop

    layers = lm.get_submodule(layers_attr)
    _move_all_but(lm, layers, device)  # embeddings, rotary tables: what runs before layer 0
    captured: list[tuple[Any, dict[str, Any]]] = []

    def hook(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        kw = {k: v for k, v in kwargs.items()
              if not (k in ("past_key_values", "past_key_value", "cache") or "Cache" in type(v).__name__)}
        kw["use_cache"] = False
        captured.append((hidden, kw))
        raise _Stop

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            for batch in length_batches(samples, batch_tokens):
                try:
                    lm(input_ids=torch.tensor(batch, device=device), use_cache=False)
                except _Stop:
                    pass
    finally:
        handle.remove()
    _move_all_but(lm, layers, "cpu")
    return captured


def _move_all_but(lm: Any, keep: Any, device: Any) -> None:
    """Move every parameter and buffer of `lm` outside the module `keep` to `device`."""
    kept = {id(m) for m in keep.modules()}
    for mod in lm.modules():
        if id(mod) not in kept:
            for p in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
                p.data = p.data.to(device)


def _check_options(method: str, bits: int, group_size: int, damp: float, act_order: bool) -> None:
    if method not in METHODS:
        raise BadInput(f"unknown method {method!r}", "use --method " + " or ".join(METHODS))
    if bits not in (4, 8):
        raise BadInput(f"--bits {bits} is not supported", "use --bits 4 or --bits 8")
    if group_size != -1 and group_size <= 0:
        raise BadInput(f"--group-size {group_size} must be positive (or -1 per channel)",
                       "use 128, or 64 for hidden sizes 128 does not divide")
    if not 0 < damp < 1:
        raise BadInput(f"--damp {damp} must be between 0 and 1", "0.01 is the usual value")
    if act_order and method == "awq":
        raise BadInput("--act-order applies to GPTQ only", "use --no-act-order with --method awq")


def _check_group_size(shapes: dict[str, list[int]], linears: tuple[str, ...], group: int) -> None:
    """Every quantized input size must be a multiple of the group size: name the ones that are not."""
    if group == -1:
        return
    ins = {name: shape[1] for name, shape in shapes.items()
           if any(name.endswith(f".{lin}.weight") for lin in linears)}
    bad = {name: n for name, n in ins.items() if n % group}
    if bad:
        name, n = next(iter(bad.items()))
        fits = [g for g in GROUP_SIZES if all(v % g == 0 for v in ins.values())]
        raise BadInput(f"--group-size {group} does not divide the input size {n} of {name}",
                       f"use --group-size {' or '.join(map(str, fits)) if fits else '-1'}")


def _device(device: str) -> Any:
    import torch

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise BadInput(f"unknown --device {device}", "use auto, cpu or cuda")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput("--device cuda but no CUDA GPU is visible", "use --device cpu")
    return torch.device(device)


def _check_memory(info: dict[str, Any], n_tokens: int, dev: Any) -> None:
    """One layer, its Hessian and two copies of the calibration activations must fit."""
    import psutil
    import torch

    hidden = int(info["hidden_size"])
    layer_bytes = sum(s[0] * s[1] for n, s in info["linear_shapes"].items() if ".N." in n) * 4
    widest = max(s[1] for s in info["linear_shapes"].values())
    need = layer_bytes * 2 + widest * widest * 4 * 3 + n_tokens * hidden * 4 * 2
    free = (torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda"
            else psutil.virtual_memory().available)
    if need > free:
        raise BadInput(f"quantizing needs about {need / 2**30:.1f} GiB on {dev.type}, "
                       f"{free / 2**30:.1f} GiB is free",
                       "use fewer or shorter calibration samples, or another --device")


def _peak_memory(dev: Any) -> dict[str, float]:
    import torch

    peak = {"cpu_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
    if dev.type == "cuda":
        peak["gpu_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
    return peak
