"""A decoder layer's structure, read from the model rather than from a table.

For the model's config, a one-layer copy with random weights (vocabulary cut to a few hundred
tokens) runs a few tokens while hooks watch layer 0:
- the linears it calls, in order; those that read the same input form one group (one Hessian,
  one stacked GPTQ step: the modules vLLM fuses);
- for each group, the norm or linear before it where AWQ can fold its scales: the nearest module
  for which folding random scales leaves the layer's output unchanged (so a Gemma norm's
  `1 + weight`, a fused `gate_up_proj`'s up half, or no such module at all are found the same way).

`OVERRIDES` holds what a reading cannot give (empty today). An architecture is refused only for
a stated reason: a layer type quantkit cannot quantize, with the reason in the error.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput
from quantkit.quantize.families import AWQMapping, Family

OVERRIDES: dict[str, Family] = {}
PROBE_TOKENS = 16  # tokens per probe sequence (two sequences)
FOLD_TOLERANCE = 1e-4  # relative change of the layer's output that still counts as unchanged
_GGUF_HINT = "use --method gguf (llama.cpp quantizes it), or a dense model"


def read_structure(path: Path) -> Family:
    """The decoder-layer structure of the model in folder `path` (cached per config)."""
    config = json.loads((Path(path) / "config.json").read_text())
    override = OVERRIDES.get(str(config.get("model_type")))
    return override or _read(json.dumps(config, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _read(config_json: str) -> Family:
    import torch

    from quantkit.quantize.capture import capture_inputs

    config = json.loads(config_json)
    kind = config.get("model_type")
    lm = _one_layer_model(config)
    layers_attr = _layers_attr(lm, kind)
    layer = lm.get_submodule(layers_attr)[0]
    _refuse_unsupported(layer, kind)
    vocab = int(lm.get_input_embeddings().num_embeddings)
    g = torch.Generator().manual_seed(0)
    samples = torch.randint(0, vocab, (2, PROBE_TOKENS), generator=g).tolist()
    batches = capture_inputs(lm, layers_attr, samples, torch.device("cpu"), 2 * PROBE_TOKENS)
    groups, order = _groups(layer, batches, kind)
    awq = tuple(_awq_mapping(layer, batches, group, order) for group in groups)
    return Family(layers_attr=layers_attr, sequential=tuple(groups), awq=awq)


def _one_layer_model(config: dict[str, Any]) -> Any:
    """The architecture with one decoder layer, random float32 weights and a small vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind = config.get("model_type")
    small = dict(config, num_hidden_layers=1, vocab_size=min(int(config.get("vocab_size") or 256),
                                                                256))
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = small.get(key)
        if isinstance(ids, int) and ids >= small["vocab_size"] or isinstance(ids, list):
            small[key] = None
    if isinstance(small.get("layer_types"), list):
        small["layer_types"] = small["layer_types"][:1]
    small.pop("quantization_config", None)
    try:
        cfg = AutoConfig.for_model(**small)
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    except Exception as exc:  # noqa: BLE001 - unknown model types, configs transformers rejects
        raise BadInput(f"architecture {kind!r}: transformers cannot build it from its config "
                       f"({type(exc).__name__}: {str(exc)[:160]})",
                       "upgrade transformers, or " + _GGUF_HINT) from exc


def _layers_attr(lm: Any, kind: Any) -> str:
    """Where the decoder layers live: the one-element ModuleList holding linears."""
    from torch import nn

    found = [name for name, mod in lm.named_modules()
             if isinstance(mod, nn.ModuleList) and len(mod) == 1
             and any(p.ndim >= 2 for p in mod[0].parameters())]
    if not found:
        raise BadInput(f"architecture {kind!r}: no list of decoder layers holding weight "
                       "matrices found", _GGUF_HINT)
    return min(found, key=lambda n: (not n.endswith("layers"), len(n)))


def _refuse_unsupported(layer: Any, kind: Any) -> None:
    """Layer types the layer loop and the compressed-tensors writer cannot handle, by name."""
    from torch import nn

    for name, mod in layer.named_modules():
        # experts: fused 3-D parameters (transformers 5) or a list of per-expert modules
        if isinstance(mod, nn.ModuleList) or any(p.ndim == 3 for p in mod.parameters(
                recurse=False)):
            raise BadInput(f"architecture {kind!r}: {name} ({type(mod).__name__}) holds "
                           "mixture-of-experts weights; GPTQ/AWQ of experts is not built yet",
                           _GGUF_HINT)
    for name, mod in layer.named_modules():
        if not isinstance(mod, nn.Linear) and any(p.ndim == 2 for p in mod.parameters(
                recurse=False)):
            raise BadInput(f"architecture {kind!r}: {name} is a {type(mod).__name__} holding a "
                           "weight matrix, not an nn.Linear, which GPTQ/AWQ here cannot "
                           "quantize", _GGUF_HINT)


def _groups(layer: Any, batches: list[Any], kind: Any
            ) -> tuple[list[tuple[str, ...]], list[str]]:
    """The linears in call order, grouped by identical input; and every parametered module's
    name in call order (the candidates for AWQ's folds)."""
    import torch
    from torch import nn

    from quantkit.quantize.layers import run_layer

    order: list[str] = []
    inputs: dict[str, Any] = {}

    def seen(name: str, mod: nn.Module) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            if name not in order:
                order.append(name)
                if isinstance(mod, nn.Linear):
                    inputs[name] = args[0].detach().clone()
        return hook

    watched = [(n, m) for n, m in layer.named_modules()
               if n and list(m.parameters(recurse=False))]
    handles = [m.register_forward_pre_hook(seen(n, m)) for n, m in watched]
    try:
        with torch.no_grad():
            run_layer(layer, batches[:1])
    finally:
        for h in handles:
            h.remove()
    linears = [n for n, m in watched if isinstance(m, nn.Linear)]
    unused = [n for n in linears if n not in inputs]
    if unused:
        raise BadInput(f"architecture {kind!r}: linear {unused[0]} is never called in the "
                       "layer's forward, so it has no calibration inputs", _GGUF_HINT)
    groups: list[list[str]] = []
    for name in (n for n in order if n in inputs):
        x = inputs[name]
        same = next((g for g in groups if inputs[g[0]].shape == x.shape
                     and torch.equal(inputs[g[0]], x)), None)
        if same is None:
            groups.append([name])
        else:
            same.append(name)
    return [tuple(g) for g in groups], order


def _awq_mapping(layer: Any, batches: list[Any], group: tuple[str, ...], order: list[str]
                 ) -> AWQMapping:
    """The nearest module before the group into which AWQ's scales fold exactly: a 1-D weight
    (a norm, multiplying by `weight` or by `offset + weight`) or a linear whose last rows feed
    the group; AWQMapping(None, group) when none does (AWQ then only clips that group)."""
    from torch import nn

    n = layer.get_submodule(group[0]).in_features
    before = order[:order.index(group[0])]
    for name in reversed(before):
        if name in group:
            continue
        mod = layer.get_submodule(name)
        w = getattr(mod, "weight", None)
        if isinstance(mod, nn.Linear) and mod.out_features >= n:
            if _folds(layer, batches, name, group, 0.0):
                return AWQMapping(name, group)
        elif w is not None and w.ndim == 1 and w.shape[0] == n:
            for offset in (0.0, 1.0):
                if _folds(layer, batches, name, group, offset):
                    return AWQMapping(name, group, offset)
    return AWQMapping(None, group)


def _folds(layer: Any, batches: list[Any], prev: str, group: tuple[str, ...],
           offset: float) -> bool:
    """Whether folding random scales into `prev` (inverse into the group's inputs) leaves the
    layer's output unchanged; the weights are restored either way."""
    import torch

    from quantkit.quantize.awq import fold_scales
    from quantkit.quantize.layers import run_layer

    p = layer.get_submodule(prev)
    mods = [layer.get_submodule(name) for name in group]
    saved = [t.detach().clone() for t in (p.weight, *(m.weight for m in mods))]
    bias = p.bias.detach().clone() if getattr(p, "bias", None) is not None else None
    g = torch.Generator().manual_seed(1)
    scales = torch.exp(torch.empty(mods[0].in_features).uniform_(-1.0, 1.0, generator=g))
    with torch.no_grad():
        ref = _flat(run_layer(layer, batches[:1]))
        try:
            new_w, new_b, new_next = fold_scales(p.weight.data, bias, [m.weight.data for m in mods],
                                                 scales, norm_offset=offset)
        except ValueError:
            return False
        p.weight.data.copy_(new_w)
        if new_b is not None:
            p.bias.data.copy_(new_b)
        for m, nw in zip(mods, new_next):
            m.weight.data.copy_(nw)
        out = _flat(run_layer(layer, batches[:1]))
        p.weight.data.copy_(saved[0])
        if bias is not None:
            p.bias.data.copy_(bias)
        for m, w in zip(mods, saved[1:]):
            m.weight.data.copy_(w)
    return bool(((out - ref).norm() / ref.norm().clamp_min(1e-12)) < FOLD_TOLERANCE)


def _flat(outs: list[Any]) -> Any:
    import torch

    return torch.cat([o.reshape(-1).float() for o in outs])
