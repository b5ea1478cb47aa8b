"""What vLLM's compressed-tensors loader reads of an artifact's quantization_config, checked
before `vllm serve` starts: the format, each scheme's weights (int 4/8-bit groups or channels a
Marlin/Machete kernel takes, or E4M3), its activations (none, or FP8 as the W8A8 and W4A8
kernels take them), the ignore list. Pure: vLLM is never imported here."""

from __future__ import annotations

import re
from typing import Any

from quantkit.errors import BadInput

# compressed-tensors formats vLLM's loader knows (vllm/model_executor/layers/quantization/compressed_tensors)
VLLM_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized", "marlin-24")


def _major_minor(v: str) -> tuple[int, int]:
    nums = [int(x) for x in re.findall(r"\d+", v)[:2]] + [0, 0]
    return nums[0], nums[1]


# what vLLM's CompressedTensorsWNA16 scheme takes (Marlin / Machete weight-only kernels)
VLLM_WNA16_BITS = (4, 8)
VLLM_GROUP_SIZES = (-1, 32, 64, 128)
VLLM_ACTORDER = (None, "weight", "static", "group", "dynamic")


def first_group(quant_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """A compressed-tensors config's first config group (the one quantkit writes), or None."""
    for scheme in ((quant_config or {}).get("config_groups") or {}).values():
        return scheme or {}
    return None


def scheme_of(quant_config: dict[str, Any] | None) -> str:
    """What vLLM runs an artifact as, by its first config group (`_kind`), or "unquantized"."""
    scheme = first_group(quant_config)
    return "unquantized" if scheme is None else _kind(scheme)


def _kind(scheme: dict[str, Any] | None) -> str:
    """Which of vLLM's kernel families a config group goes to: "FP8" (float weights), "W4A8" (int
    weights, FP8 activations) or "weight-only int"."""
    if ((scheme or {}).get("weights") or {}).get("type") == "float":
        return "FP8"
    return "W4A8" if (scheme or {}).get("input_activations") else "weight-only int"


def check_vllm_compat(quant_config: dict[str, Any], versions: dict[str, str],
                      in_features: dict[str, int] | None = None) -> list[str]:
    """Refuse what vLLM cannot load, by what its compressed-tensors loader reads: the method and
    format, each scheme's weight args (int, 4/8 bits, group or channel strategy, a group size its
    kernels take; or E4M3), its activations (none, or FP8 as its W8A8 and W4A8 kernels take
    them), the ignore list; return warnings. A newer
    compressed-tensors stamp than vLLM's is only a warning: the fields decide."""
    hint = "re-quantize with quantkit quantize --method gptq|awq (pack-quantized, W4/W8)"
    if quant_config.get("quant_method") != "compressed-tensors":
        raise BadInput("vLLM serves quantkit's GPTQ/AWQ artifacts as compressed-tensors; this "
                       f"checkpoint is {quant_config.get('quant_method') or 'not quantized'}",
                       "quantize with quantkit quantize --method gptq|awq")
    fmt = quant_config.get("format")
    if fmt not in VLLM_FORMATS:
        raise BadInput(f"vLLM cannot read the compressed-tensors format {fmt!r}",
                       "re-quantize to pack-quantized (quantkit's default)")
    groups = quant_config.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise BadInput("the quantization_config has no config_groups", hint)
    warnings: list[str] = []
    for name, scheme in groups.items():
        where = f"config_groups.{name}"
        w = (scheme or {}).get("weights") or {}
        acts = (scheme or {}).get("input_activations") or {}
        kind = _kind(scheme)
        if kind == "FP8":
            warnings += _check_fp8_scheme(where, w, acts, hint)
            continue
        if kind == "W4A8":
            warnings += _check_w4a8_scheme(where, w, acts, hint)
        if w.get("type") != "int" or w.get("num_bits") not in VLLM_WNA16_BITS:
            raise BadInput(f"{where}: {w.get('type')} {w.get('num_bits')}-bit weights are not "
                           "a scheme vLLM's weight-only kernels take", hint)
        strategy, gs = w.get("strategy"), w.get("group_size")
        if strategy not in ("group", "channel"):
            raise BadInput(f"{where}: weight strategy {strategy!r} is not group or channel", hint)
        size = -1 if strategy == "channel" else gs
        if size not in VLLM_GROUP_SIZES:
            raise BadInput(f"{where}: group size {gs} is not one vLLM's Marlin/Machete kernels take "
                           f"({', '.join(map(str, VLLM_GROUP_SIZES))})",
                           "re-quantize with --group-size 128 (or 64, 32)")
        if w.get("actorder") not in VLLM_ACTORDER:
            raise BadInput(f"{where}: actorder {w.get('actorder')!r} is unknown to vLLM", hint)
        if not w.get("symmetric", True):
            warnings.append(f"{where} is asymmetric: vLLM takes zero points on Marlin only "
                            "(not Machete)")
        for layer, n in (in_features or {}).items():
            if size > 0 and n % size:
                raise BadInput(f"{layer}: input size {n} is not a multiple of group size {size}",
                               hint)
    if not isinstance(quant_config.get("ignore", []), list):
        raise BadInput("the quantization_config's ignore is not a list", hint)
    made_with = str(quant_config.get("version") or "0")
    ships = versions.get("compressed-tensors", "0")
    if _major_minor(made_with) > _major_minor(ships):
        warnings.append(f"written by compressed-tensors {made_with}, read by vLLM "
                        f"{versions.get('vllm')}'s {ships}: every field it reads was checked")
    return warnings


def _fp8_inputs(where: str, acts: dict[str, Any], hint: str, static_ok: bool) -> None:
    """FP8 activations as vLLM's kernels take them: E4M3, symmetric, per token and dynamic, or
    (W8A8 only) one static scale per tensor."""
    if acts.get("type") != "float" or acts.get("num_bits") != 8 or not acts.get("symmetric", True):
        raise BadInput(f"{where}: {acts.get('type')} {acts.get('num_bits')}-bit activations are "
                       "not FP8 (E4M3, symmetric), the only ones quantkit serves", hint)
    dynamic_token = acts.get("dynamic") is True and acts.get("strategy") == "token"
    static_tensor = acts.get("dynamic") is False and acts.get("strategy") == "tensor"
    if not (dynamic_token or (static_ok and static_tensor)):
        raise BadInput(f"{where}: FP8 activations {acts.get('strategy')} "
                       f"{'dynamic' if acts.get('dynamic') else 'static'} are not a scheme "
                       "vLLM's FP8 kernels take", hint)


def _check_fp8_scheme(where: str, w: dict[str, Any], acts: dict[str, Any] | None,
                      hint: str) -> list[str]:
    """FP8 W8A8 (float-quantized): E4M3 weights per channel or tensor, FP8 activations."""
    if w.get("num_bits") != 8 or w.get("strategy") not in ("channel", "tensor") or not w.get(
            "symmetric", True):
        raise BadInput(f"{where}: float {w.get('num_bits')}-bit {w.get('strategy')} weights are "
                       "not E4M3 per channel or per tensor", hint)
    if acts:
        _fp8_inputs(where, acts, hint, static_ok=True)
    return ["FP8 W8A8 runs vLLM's CUTLASS FP8 kernels on compute capability 8.9+ (Ada, Hopper); "
            "older GPUs fall back to weight-only FP8 (Marlin)"]


def _check_w4a8_scheme(where: str, w: dict[str, Any], acts: dict[str, Any], hint: str
                       ) -> list[str]:
    """W4A8 (int4 weights, FP8 activations): vLLM's CUTLASS W4A8 kernel, group 128, symmetric."""
    _fp8_inputs(where, acts, hint, static_ok=False)
    if w.get("num_bits") != 4 or w.get("strategy") != "group" or w.get("group_size") != 128 \
            or not w.get("symmetric", True):
        raise BadInput(f"{where}: FP8 activations with {w.get('num_bits')}-bit "
                       f"{w.get('strategy')} weights (group {w.get('group_size')}): vLLM's W4A8 "
                       "kernel takes 4-bit symmetric weights in groups of 128 only",
                       "re-quantize with --bits 4 --group-size 128 --sym --activations fp8")
    return ["W4A8 runs vLLM's CUTLASS W4A8 kernel on Hopper (compute capability 9.0) only"]
