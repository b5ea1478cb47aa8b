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
from quantkit.quantize.families import AWQMapping, ExpertMatrix, Experts, Family

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
    experts = _experts(lm, layer, config, kind)
    _refuse_unsupported(layer, kind, experts)
    vocab = int(lm.get_input_embeddings().num_embeddings)
    g = torch.Generator().manual_seed(0)
    samples = torch.randint(0, vocab, (2, PROBE_TOKENS), generator=g).tolist()
    batches = capture_inputs(lm, layers_attr, samples, torch.device("cpu"), 2 * PROBE_TOKENS)
    groups, order = _groups(layer, batches, kind, experts.routers if experts else ())
    awq = tuple(_awq_mapping(layer, batches, group, order) for group in groups)
    return Family(layers_attr=layers_attr, sequential=tuple(groups), awq=awq, experts=experts)


def check_uniform_layers(layers: Any, kind: Any) -> None:
    """The structure is read from layer 0: refuse a model whose layers differ from it (dense and
    mixture-of-experts layers mixed, as DeepSeek's first dense layers), before any work."""
    def shape(layer: Any) -> list[tuple[str, str]]:
        return [(n, type(m).__name__) for n, m in layer.named_modules()]

    first = shape(layers[0])
    other = next((i for i, layer in enumerate(layers) if shape(layer) != first), None)
    if other is not None:
        raise BadInput(f"architecture {kind!r}: decoder layer {other} is built unlike layer 0 "
                       "(dense and mixture-of-experts layers mixed); GPTQ/AWQ here reads one "
                       "structure for every layer", _GGUF_HINT)


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


def _experts(lm: Any, layer: Any, config: dict[str, Any], kind: Any) -> Experts | None:
    """The layer's mixture-of-experts block, read from the model (None for a dense layer): the
    module holding fused 3-D expert parameters, checked to compute down(act(gate) * up) per
    expert; the routers beside it; the per-expert names transformers saves them under."""
    from torch import nn

    lists = [n for n, m in layer.named_modules() if isinstance(m, nn.ModuleList)]
    if lists:
        raise BadInput(f"architecture {kind!r}: {lists[0]} is a list of per-expert modules; "
                       "GPTQ/AWQ here quantizes the fused 3-D experts transformers 5 builds",
                       _GGUF_HINT)
    fused = [(n, m) for n, m in layer.named_modules()
             if any(p.ndim == 3 for p in m.parameters(recurse=False))]
    if not fused:
        return None
    name, mod = fused[0]
    params = dict(mod.named_parameters(recurse=False))
    pair = [(a, b) for a, pa in params.items() for b, pb in params.items()
            if pa.ndim == pb.ndim == 3 and pa.shape[0] == pb.shape[0]
            and pa.shape[1] == 2 * pb.shape[2] and pa.shape[2] == pb.shape[1]]
    if len(fused) > 1 or len(params) != 2 or len(pair) != 1 or not _expert_math_holds(
            mod, *pair[0]):
        raise BadInput(f"architecture {kind!r}: {name} ({type(mod).__name__}) holds experts "
                       "that are not down(act(gate) * up) over fused gate_up/down parameters "
                       "without biases, which GPTQ/AWQ here quantizes", _GGUF_HINT)
    gate_up, down = pair[0]
    count = int(params[gate_up].shape[0])
    block = name.rsplit(".", 1)[0] if "." in name else ""
    routers = tuple(n for n, m in layer.named_modules()
                    if n.startswith(block) and n != name and not n.startswith(name + ".")
                    and isinstance(getattr(m, "weight", None), nn.Parameter)
                    and m.weight.ndim == 2 and m.weight.shape[0] in (1, count))
    matrices, renames = _saved_names(lm, layer, name, (gate_up, down))
    # the per-expert checkpoint is written (and read, --stream) one matrix per expert: a layout
    # stacking every expert in one tensor (GraniteMoE's input_linear) is refused by name
    stacked = next((m for m in matrices if "{e}" not in m.saved
                    or m.stop > params[m.param].shape[1]), None)
    if stacked is not None:
        raise BadInput(f"architecture {kind!r}: its checkpoint stores the experts of {name} "
                       f"stacked in one 3-D tensor ({stacked.saved}.weight "
                       f"{list(params[stacked.param].shape)}), not one matrix per expert as "
                       "GPTQ/AWQ here reads and writes them", _GGUF_HINT)
    return Experts(module=name, count=count, top_k=int(config.get("num_experts_per_tok") or 0),
                   gate_up=gate_up, down=down, matrices=matrices, routers=routers,
                   renames=renames)


def _expert_math_holds(mod: Any, gate_up: str, down: str) -> bool:
    """Whether the experts module, given every token routed to one expert at weight 1, returns
    down(act(gate) * up) of that expert (what per-expert quantization reproduces)."""
    import torch

    from quantkit.quantize.experts import expert_forward

    if not callable(getattr(mod, "act_fn", None)):
        return False
    w = getattr(mod, gate_up)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, w.shape[2], generator=g)
    with torch.no_grad():
        for e in (0, w.shape[0] - 1):
            try:
                out = mod(x, torch.full((5, 1), e), torch.ones(5, 1))
            except Exception:  # noqa: BLE001 - another calling convention: not this layout
                return False
            ref = expert_forward(mod.act_fn, getattr(mod, gate_up)[e], getattr(mod, down)[e], x)
            if not torch.allclose(out, ref, rtol=1e-4, atol=1e-5):
                return False
    return True


def _saved_names(lm: Any, layer: Any, experts: str, params: tuple[str, ...]
                 ) -> tuple[tuple[ExpertMatrix, ...], tuple[tuple[str, str], ...]]:
    """The names transformers saves the layer's tensors under: each fused expert parameter's
    per-expert row ranges (read by reverting the load-time conversion on tensors that hold
    their own row numbers), and the other keys that are renamed."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    prefix = _layers_prefix(lm, layer)
    coded: dict[str, Any] = {}
    base = 0
    codes: dict[str, tuple[str, int, int]] = {}  # first code -> (key, rows per expert, base)
    for key, value in layer.state_dict().items():
        if key.startswith(experts + ".") and key.rsplit(".", 1)[1] in params:
            count, rows = value.shape[:2]
            coded[prefix + key] = (torch.arange(count * rows, dtype=torch.float64) + base
                                   ).reshape(count, rows, 1)
            codes[key] = (key.rsplit(".", 1)[1], rows, base)
            base += count * rows
        else:
            coded[prefix + key] = torch.tensor([float(base)], dtype=torch.float64)
            codes[key] = ("", 0, base)
            base += 1
    by_base = sorted(codes.items(), key=lambda kv: kv[1][2])
    matrices: list[ExpertMatrix] = []
    renames: list[tuple[str, str]] = []
    for saved, value in revert_weight_conversion(lm, coded).items():
        first = int(value.reshape(-1)[0])
        key, (param, rows, start) = next((k, c) for k, c in reversed(by_base) if c[2] <= first)
        saved = saved.removeprefix(prefix)
        if not param:
            if saved != key:
                renames.append((key, saved))
            continue
        e, row = divmod(first - start, rows)
        stop = row + int(value.reshape(-1).shape[0])
        pattern = saved.removesuffix(".weight").replace(f".{e}.", ".{e}.", 1)
        if e == 0:
            matrices.append(ExpertMatrix(param=param, start=row, stop=stop, saved=pattern))
    return tuple(sorted(matrices, key=lambda m: (m.param != params[0], m.start))), tuple(renames)


def _layers_prefix(lm: Any, layer: Any) -> str:
    """The state-dict prefix of decoder layer 0 (`model.layers.0.`)."""
    return next(n for n, m in lm.named_modules() if m is layer) + "."


def _refuse_unsupported(layer: Any, kind: Any, experts: Experts | None) -> None:
    """Layer types the layer loop and the compressed-tensors writer cannot handle, by name."""
    from torch import nn

    skip = (experts.module, *experts.routers) if experts else ()
    for name, mod in layer.named_modules():
        if name in skip:
            continue
        if not isinstance(mod, nn.Linear) and any(p.ndim == 2 for p in mod.parameters(
                recurse=False)):
            raise BadInput(f"architecture {kind!r}: {name} is a {type(mod).__name__} holding a "
                           "weight matrix, not an nn.Linear, which GPTQ/AWQ here cannot "
                           "quantize", _GGUF_HINT)


def _groups(layer: Any, batches: list[Any], kind: Any, routers: tuple[str, ...] = ()
            ) -> tuple[list[tuple[str, ...]], list[str]]:
    """The linears in call order (routers left out), grouped by identical input; and every
    parametered module's name in call order (the candidates for AWQ's folds)."""
    import torch
    from torch import nn

    from quantkit.quantize.layers import run_layer

    order: list[str] = []
    inputs: dict[str, Any] = {}

    def seen(name: str, mod: nn.Module) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            if name not in order:
                order.append(name)
                if isinstance(mod, nn.Linear) and name not in routers:
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
    linears = [n for n, m in watched if isinstance(m, nn.Linear) and n not in routers]
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
