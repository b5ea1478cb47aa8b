"""Does a recipe fit the GPU: each GPU phase's memory need (quantization's layer, Hessians and
calibration activations; validation's two vLLM engines; the server with its draft model), from the
model's files and the recipe, against the GPU's memory, before any step runs (`quantkit run`'s
preflight). A phase that cannot fit is one `error:` with the `hint:` that makes it fit, exit 2.

Estimates, not measurements: each is an upper bound the phase's measured peak (run.json) should
stay under. Pure at import; reads config.json and the safetensors headers, no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.engines.vllm import validate_share  # each of validation's two engines' GPU share
from quantkit.errors import BadInput

if TYPE_CHECKING:
    from quantkit.config import Recipe
    from quantkit.models import ModelInfo

GIB = 1024**3
CUDA_CONTEXT = GIB  # what a process that computes on the GPU holds beside its own tensors
ENGINE_OVERHEAD = 3 * GIB  # a vLLM engine beside its weights and KV cache: CUDA context,
# activations of a prefill chunk, CUDA graphs, the sampler's logits (an upper bound)
VALIDATE_CONTEXT = 2048  # VllmEngine's max_context: its KV cache must hold one such sequence


@dataclass(frozen=True)
class Need:
    """One phase's memory need on the GPU against what it may use there."""

    phase: str
    need_gib: float
    budget_gib: float
    what: str   # what the need is made of, for the error
    hint: str   # what makes it fit

    @property
    def fits(self) -> bool:
        return self.need_gib <= self.budget_gib


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int:
    """Keys and values of one token over all layers (vLLM's KV cache in 16 bits)."""
    from quantkit.models import text_config

    text = text_config(config)
    heads = int(text.get("num_attention_heads") or 1)
    kv = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size") or 0) // heads)
    return 2 * int(text.get("num_hidden_layers") or 0) * kv * head_dim * dtype_bytes


def quantized_bytes(info: ModelInfo, bits: int, group_size: int) -> int:
    """A compressed-tensors artifact's weights: the decoder layers' linears at `bits` with a
    16-bit scale per group, everything else as stored in the original."""
    per_layer = sum(o * i for name, (o, i) in info.linear_shapes.items() if ".N." in name)
    linears = per_layer * int(info.layers or 0)
    group = group_size if group_size > 0 else max((i for _, i in info.linear_shapes.values()),
                                                  default=1)
    rest = max(info.size_bytes - linears * 2, 0)
    return int(linears * bits / 8 + linears / group * 2 + rest)


def recipe_needs(r: Recipe, total: float, info: ModelInfo, engine: str) -> list[Need]:
    """Each GPU phase of the recipe against a GPU of `total` bytes; `engine` is the one that
    will validate and serve the artifact."""
    from quantkit.engines.choice import ENGINES
    from quantkit.methods import METHODS
    from quantkit.quantize.preflight import quantize_need

    config = json.loads((Path(info.path) / "config.json").read_text())
    kv = kv_bytes_per_token(config)
    needs = []
    q = r.quantize
    if q.device in ("cuda", "auto") and METHODS[q.method].layerwise:
        n_tokens = r.calibration.samples * r.calibration.max_tokens
        work, acts = quantize_need(info, n_tokens)
        needs.append(Need(
            "quantize", (work + acts + CUDA_CONTEXT) / GIB, total / GIB,
            f"one decoder layer, its Hessians and the activations of {r.calibration.samples} "
            f"samples x {r.calibration.max_tokens} tokens ({acts / GIB:.1f} GiB)",
            "calibrate with fewer or shorter samples (calibration.samples, max_tokens), or "
            "quantize with device: cpu"))
    if not ENGINES[engine].gpu:  # validation's engines on the GPU (vLLM's), else nothing there
        return needs
    weights = info.size_bytes
    share = validate_share(total)  # two engines side by side, each with its overheads
    needs.append(Need(
        "validate", (weights + ENGINE_OVERHEAD + kv * VALIDATE_CONTEXT) / GIB, share * total / GIB,
        f"the original model's {weights / GIB:.1f} GiB of weights in one of validation's two "
        f"vLLM engines ({share:.0%} of the GPU each, which leaves room for what each holds "
        "beyond its share)",
        "validate on a GPU with more memory, or with validate.engine: transformers"))
    s = r.serve
    art = quantized_bytes(info, q.bits, q.group_size)
    from quantkit.artifact import folder_size

    # a local draft's weights; a hub id not yet downloaded counts nothing (vLLM fetches it)
    draft = folder_size(Path(s.draft_model)) if s.draft_model and Path(s.draft_model).is_dir() \
        else 0
    ctx = int(s.ctx_size or VALIDATE_CONTEXT)
    needs.append(Need(
        "serve", (art + draft + ENGINE_OVERHEAD + kv * ctx) / GIB,
        s.gpu_memory_utilization * total / GIB,
        f"the artifact's ~{art / GIB:.1f} GiB of weights"
        + (f", the draft model's {draft / GIB:.1f} GiB" if draft else "")
        + f" and the KV cache of one {ctx}-token sequence ({kv * ctx / GIB:.1f} GiB)",
        "raise serve.gpu_memory_utilization, lower serve.ctx_size, or drop draft_model"))
    return needs


def check_recipe_fits(r: Recipe) -> list[Need]:
    """The recipe's GPU phases against this machine's GPU; BadInput for the first that cannot
    fit. Nothing to check without a GPU, or for a model not on disk yet (a hub id: its first
    step downloads it, and quantize checks its own memory then)."""
    from quantkit.gpu import gpu_info

    gpu = gpu_info()
    local = Path(r.model)
    if gpu is None or not (local / "config.json").is_file():
        return []
    from quantkit.engines.choice import choose_engine
    from quantkit.methods import METHODS
    from quantkit.models import model_info

    info = model_info(local)
    checkpoint = METHODS[r.quantize.method].checkpoint
    engine = choose_engine(checkpoint, r.validate.engine, "validate")
    total = gpu["total_mib"] * 1024**2
    return check_needs(recipe_needs(r, total, info, engine), total)


def check_needs(needs: list[Need], total: float) -> list[Need]:
    """BadInput naming the first phase that does not fit a GPU of `total` bytes; else `needs`."""
    for n in needs:
        if not n.fits:
            raise BadInput(f"the recipe does not fit this GPU at its {n.phase} step: it needs "
                           f"about {n.need_gib:.1f} GiB ({n.what}), {n.budget_gib:.1f} GiB of "
                           f"the GPU's {total / GIB:.1f} GiB is there for it", n.hint)
    return needs
