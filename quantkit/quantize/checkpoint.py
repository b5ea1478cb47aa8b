"""The compressed-tensors checkpoint, written one decoder layer per shard so a run can resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from quantkit.fp8 import FP8, dequantize_fp8, fp8_input_args
from quantkit.fsutil import atomic_write_text, dumps, write_json
from quantkit.kvcache import KV_SCHEME, KV_SUFFIXES
from quantkit.quantize.families import Family, group_target
from quantkit.quantize.layers import UPGRADE_BITS, LinearResult, QuantSpec, linear
from quantkit.quantize.numerics import dequantize
from quantkit.quantize.pack import quantization_config, to_compressed_tensors_state, unpack_int4

if TYPE_CHECKING:
    from quantkit.artifact import LayerCoverage

STATE = "resume.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt")


def _shard(i: int) -> str:
    return f"model-layer-{i:05d}.safetensors"


def layer_tensors(i: int, prefix: str, layer: nn.Module, family: Family,
                  results: dict[str, LinearResult], spec: QuantSpec) -> dict[str, torch.Tensor]:
    """Layer i's shard contents on the CPU, under the names transformers saves them: linears
    (and experts, keyed by their per-expert names) packed where they were quantized (a GPU packs
    in milliseconds what takes a CPU seconds), then the layer's other parameters."""
    tensors: dict[str, torch.Tensor] = {}
    for name, r in results.items():
        saved = family.saved_linear(name) if name in family.linears else name
        tensors.update({k: v.cpu() for k, v in linear_state(f"{prefix}.{i}.{saved}", r,
                                                             spec).items()})
    skip = {f"{n}.weight" for n in family.linears} | set(
        family.experts.fused_keys if family.experts else ())
    for key, value in layer.state_dict().items():
        if key not in skip:
            tensors[f"{prefix}.{i}.{family.saved_key(key)}"] = stored(value, spec)
    return tensors


def linear_state(name: str, r: LinearResult, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """A quantized linear's tensors under `name`: packed integers (pack-quantized), or E4M3
    weights with their per-row scales and, for static FP8 activations, the input's scale
    (float-quantized)."""
    if r.q_int.dtype != FP8:
        return to_compressed_tensors_state(name, r.q_int, r.scale, r.zero, None, r.bits,
                                           r.group_size, spec.sym)
    state = {f"{name}.weight": r.q_int.contiguous(),
             f"{name}.weight_scale": r.scale.reshape(-1, 1).contiguous()}
    if r.input_scale is not None:
        state[f"{name}.input_scale"] = r.input_scale.reshape(1).contiguous()
    return state


def stored(value: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """An unquantized tensor as the checkpoint holds it: on the CPU, floating ones in the
    source's dtype (a CPU run computes in float32; the file keeps bf16 embeddings bf16)."""
    value = value.detach().cpu()
    if spec.scale_dtype is not None and value.is_floating_point():
        value = value.to(spec.scale_dtype)
    return value.contiguous()


class ResumeKey(TypedDict):
    """What a resumed run must match to keep the finished layers: the source, the calibration
    set, the spec's settings (QuantSpec.settings: the method's own options among them, open) and
    the dtype the work ran in."""

    source_sha256: str
    calib_sha256: str
    spec: dict[str, Any]
    compute_dtype: str


class ResumeState(TypedDict, total=False):
    """The work folder's resume.json: its key, the layers done (in order), each finished layer's
    relative output errors by linear and, for a mixture-of-experts model, its expert coverage;
    empty where there is none yet."""

    key: ResumeKey
    layers_done: int
    errors: dict[str, dict[str, float]]
    experts: dict[str, LayerCoverage]


def write_layer(partial: Path, i: int, tensors: dict[str, torch.Tensor],
                errors: dict[str, float], coverage: LayerCoverage | None = None) -> None:
    """Write layer i's shard, then mark it done (layers are written in order) with its errors
    and, for a mixture-of-experts layer, its expert coverage."""
    from safetensors.torch import save_file

    tmp = partial / (_shard(i) + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, partial / _shard(i))
    state = read_state(partial)
    state["layers_done"] = i + 1
    state.setdefault("errors", {})[str(i)] = errors
    if coverage is not None:
        state.setdefault("experts", {})[str(i)] = coverage
    atomic_write_text(partial / STATE, dumps(state))


def read_state(partial: Path) -> ResumeState:
    path = partial / STATE
    state: ResumeState = json.loads(path.read_text()) if path.is_file() else {}
    return state


def start_partial(partial: Path, key: ResumeKey, resume: bool) -> int:
    """Prepare the work folder; return how many layers a resumed run can skip."""
    state = read_state(partial)
    if resume and state.get("key") == key:
        return int(state.get("layers_done", 0))
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    atomic_write_text(partial / STATE, dumps({"key": key, "layers_done": 0, "errors": {}}))
    return 0


def load_layer(partial: Path, i: int, prefix: str, layer: nn.Module, family: Family,
               spec: QuantSpec) -> None:
    """Restore a finished layer's quantized weights (dequantized) and other parameters."""
    from safetensors.torch import load_file

    tensors = load_file(str(partial / _shard(i)))
    own = {k[len(f"{prefix}.{i}."):]: v for k, v in tensors.items()}
    for step in family.sequential:
        gs = spec.for_group(i, step)
        for name in step:
            w = linear(layer, name).weight
            w.data.copy_(_dequantized(own, family.saved_linear(name), gs.bits,
                                      gs.group_size, w))
    ex = family.experts
    if ex is not None:
        experts = layer.get_submodule(ex.module)
        for m in ex.matrices:
            param = getattr(experts, m.param)
            for e in range(ex.count):
                rows = param.data[e, m.start:m.stop]
                rows.copy_(_dequantized(own, m.saved.format(e=e), spec.bits, spec.group_size,
                                        rows))
    back = {new: old for old, new in ex.renames} if ex else {}
    rest = {back.get(k, k): v for k, v in own.items()
            if k.split(".")[-1] not in (*QUANTIZED_SUFFIXES, *KV_SUFFIXES) and v.dtype != FP8}
    layer.load_state_dict(rest, strict=False)


def _dequantized(own: dict[str, torch.Tensor], name: str, bits: int, group_size: int,
                 like: torch.Tensor) -> torch.Tensor:
    """The weight a quantized linear `name` of the shard decodes to, shaped and typed like `like`."""
    if own.get(f"{name}.weight", like).dtype == FP8:
        return dequantize_fp8(own[f"{name}.weight"], own[f"{name}.weight_scale"], like.dtype)
    out_f, in_f = like.shape
    q = unpack_int4(own[f"{name}.weight_packed"], in_f) if bits == 4 else _unpack(
        own[f"{name}.weight_packed"], bits, in_f)
    zero = own.get(f"{name}.weight_zero_point")
    if zero is not None:
        zero = (unpack_int4(zero.T.contiguous(), out_f) if bits == 4
                else _unpack(zero.T.contiguous(), bits, out_f)).T
    return dequantize(q, own[f"{name}.weight_scale"].to(like.dtype), zero, group_size)


def _unpack(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    return unpack_from_int32(packed, bits, torch.Size([packed.shape[0], cols])).to(torch.int8)


def finish(partial: Path, model: nn.Module, family: Family, source: Path, spec: QuantSpec,
           n_layers: int) -> None:
    """Add the non-layer tensors, the shard index, config.json and tokenizer files."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    prefix = family.layers_attr
    rest: dict[str, torch.Tensor] = {}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for key, value in model.state_dict().items():
        if key.startswith(prefix + ".") or (tied and key == "lm_head.weight"):
            continue
        rest[key] = stored(value, spec)
    save_file(rest, str(partial / "model-rest.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-rest.safetensors" for k in rest}
    for i in range(n_layers):
        with safe_open(str(partial / _shard(i)), "pt") as f:
            weight_map.update({k: _shard(i) for k in f.keys()})
    size = sum(f.stat().st_size for f in partial.glob("*.safetensors"))
    write_json(partial / "model.safetensors.index.json",
               {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))})
    config = json.loads((source / "config.json").read_text())
    upgraded = [group_target(prefix, i, step) for key, i, step in family.group_keys(n_layers)
                if key in spec.upgrade]
    config["quantization_config"] = quantization_config(
        spec.bits, spec.group_size, spec.sym, spec.act_order, ignore=["lm_head", *_kept(family)],
        upgraded={UPGRADE_BITS: upgraded} if upgraded else None,
        float_weights=spec.float_weights,
        inputs=fp8_input_args(spec.act_fp8 == "static") if spec.act_fp8 else None,
        kv_cache=KV_SCHEME if spec.kv_fp8 else None)
    write_json(partial / "config.json", config)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, partial / name)


def _kept(family: Family) -> list[str]:
    """Targets for the routers, kept in 16 bits: matched by their checkpoint name (vLLM) and
    their name in transformers' fused layout."""
    import re

    ex = family.experts
    if ex is None:
        return []
    names = {n for r in ex.routers for n in (r, family.saved_linear(r))}
    return [f"re:.*\\.{re.escape(n)}$" for n in sorted(names)]


QUANTIZED_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                      "input_scale")


def bits_per_weight(folder: Path, parameters: int, linear_parameters: int
                    ) -> tuple[float, float]:
    """Bits per weight of a finished checkpoint: every tensor's bytes x 8 over the source's
    `parameters` (16-bit embeddings, norms and scales included, as llama.cpp counts a GGUF),
    and the quantized linears' own (packed values, scales, zero points) over theirs."""
    from quantkit.models import safetensors_header

    total = linears = 0
    for f in folder.glob("*.safetensors"):
        for key, t in safetensors_header(f).items():
            start, end = t["data_offsets"]
            total += end - start
            if key.rsplit(".", 1)[-1] in QUANTIZED_SUFFIXES or t["dtype"].startswith("F8"):
                linears += end - start
    return (round(total * 8 / max(parameters, 1), 3),
            round(linears * 8 / max(linear_parameters, 1), 3))

