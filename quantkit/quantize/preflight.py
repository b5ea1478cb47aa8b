"""Checks before any quantization work: the model, the calibration set, shapes, device, memory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import BadInput

if TYPE_CHECKING:
    from quantkit.calib import CalibrationSet
    from quantkit.config import QuantizeConfig
    from quantkit.models import ModelInfo, ModelRef

GROUP_SIZES = (32, 64, 128, 256)


def preflight_calibration(model: str, calib: Path
                          ) -> tuple[ModelRef, ModelInfo, CalibrationSet]:
    """Resolve the model, refuse an already quantized one, and check that the calibration set
    was tokenized by this model's tokenizer. Returns (model ref, model info, calibration set)."""
    from quantkit.calib import load_calibration_set
    from quantkit.models import load_tokenizer, model_info, resolve_model, tokenizer_fingerprint

    cset = load_calibration_set(Path(calib))
    ref = resolve_model(model)
    info = model_info(ref.path)
    if info.quantized:
        raise BadInput(f"model {model} is already quantized ({info.quantization})",
                       "quantize the original full-precision model")
    fingerprint = tokenizer_fingerprint(load_tokenizer(ref.path))
    if cset.manifest.get("tokenizer", {}).get("fingerprint") != fingerprint:
        raise BadInput(f"calibration set {calib} was made with another tokenizer "
                       f"({cset.manifest.get('model')}) than {model}",
                       f"rebuild it: quantkit calibrate {model} ... --out {calib} --force")
    return ref, info, cset


def check_group_size(shapes: dict[str, list[int]], linears: tuple[str, ...], group: int) -> None:
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


def check_fp8(shapes: dict[str, list[int]], family: Any, cfg: QuantizeConfig) -> None:
    """FP8 activations: vLLM's CUTLASS kernels need every quantized linear's rows and columns in
    multiples of 128 (W4A8) or 16 (FP8 W8A8: float weights); mixture-of-experts layers are not
    built for them."""
    from quantkit.method_registry import METHODS, either

    method = cfg.traits
    what = (f"--method {cfg.method}" if method.fixed_activations
            else "--activations fp8 (W4A8)")
    others = either("--method", [n for n in METHODS if METHODS[n].layerwise
                                 and not METHODS[n].fixed_activations])
    if family.experts is not None:
        raise BadInput(f"{what} is built for dense models; this one's layers hold experts",
                       f"{others} with 16-bit activations for this model")
    tile = 16 if method.float_weights else 128

    def shape(lin: str) -> list[int] | None:
        return next((v for k, v in shapes.items() if k.endswith(f".{lin}.weight")), None)

    # vLLM fuses the linears that read one input (q/k/v, gate/up) into one matrix
    for step in family.sequential:
        found = [s for s in map(shape, step) if s is not None]
        if not found:
            continue
        rows, cols = sum(s[0] for s in found), found[0][1]
        if rows % tile or cols % tile:
            raise BadInput(f"{what}: {'/'.join(step)} is {rows} x {cols} (as vLLM fuses it), not "
                           f"a multiple of {tile} both ways, which vLLM's CUTLASS kernel needs",
                           f"{others} with 16-bit activations for this model"
                           if tile == 128 else f"{others} for this model")


def check_experts(cfg: QuantizeConfig, n_tokens: int) -> None:
    """Settings built for dense linears, refused for a mixture-of-experts model before any
    work (a method without an expert quantizer is method_registry.quantizers' to refuse)."""
    if cfg.original_hessians:
        raise BadInput("--hessians original collects one Hessian per linear; a mixture-of-"
                       "experts layer needs one per expert from its routed tokens",
                       "leave out --hessians (sequential) for this model")
    if cfg.w8_groups:
        raise BadInput("--w8-groups measures dense linear groups only; it is not built for "
                       "mixture-of-experts models", "leave out --w8-groups for this model")
    if n_tokens < cfg.expert_floor:
        raise BadInput(f"the calibration set holds {n_tokens} tokens, fewer than "
                       f"--expert-floor {cfg.expert_floor}: no expert can be calibrated, "
                       "even with every token routed through it",
                       "calibrate with more or longer samples, or lower --expert-floor")


def resolve_device(device: str) -> Any:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput("--device cuda but no CUDA GPU is visible", "use --device cpu")
    return torch.device(device)


def quantize_need(info: ModelInfo, n_tokens: int) -> tuple[int, int]:
    """Bytes a layer-by-layer quantization holds: (one layer, its Hessians and work; two copies
    of the calibration activations of `n_tokens` tokens), in float32."""
    hidden = int(info.hidden_size or 0)
    # one decoder layer in float32: the parameters over the layers (embeddings included, an
    # over-estimate), since the shapes by name count a mixture-of-experts layer's experts once
    layer_bytes = info.parameters // max(int(info.layers or 1), 1) * 4
    widest = max(s[1] for s in info.linear_shapes.values())
    return layer_bytes * 2 + widest * widest * 4 * 3, n_tokens * hidden * 4 * 2


def check_memory(info: ModelInfo, n_tokens: int, dev: Any, activations: str = "auto") -> bool:
    """One layer, its Hessian and two copies of the calibration activations must fit; on a CPU
    the activations may wait on disk instead (`activations`: auto, memory or disk). Returns
    whether they go to disk."""
    import psutil
    import torch

    work, acts = quantize_need(info, n_tokens)
    if dev.type == "cuda":
        if activations == "disk":
            raise BadInput("--activations disk applies to CPU runs: on a GPU the activations "
                           "wait in GPU memory", "leave --activations out with --device cuda")
        free = torch.cuda.mem_get_info(dev)[0]
        disk = False
    else:
        free = psutil.virtual_memory().available
        disk = activations == "disk" or (activations == "auto" and work + acts > free)
    need = work + (0 if disk else acts)
    if need > free:
        raise BadInput(f"quantizing needs about {need / 2**30:.1f} GiB on {dev.type}, "
                       f"{free / 2**30:.1f} GiB is free",
                       "use fewer or shorter calibration samples, another --device"
                       + ("" if disk or dev.type == "cuda" else ", or --activations auto"))
    if disk and activations == "auto":
        from quantkit import console

        console.log(f"the calibration activations ({acts / 2 / 2**30:.1f} GiB per copy) do not fit "
                    f"in the {free / 2**30:.1f} GiB free: they wait on disk between layers")
    return disk


