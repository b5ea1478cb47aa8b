"""How much each linear group's quantization alone hurts the model: the mean per-token
KL(original || original with only that group round-to-nearest quantized), on calibration tokens.

The groups are the ones vLLM fuses (q/k/v, o, gate/up, down per layer: `Family.group_keys`), so a
mixed-precision artifact keeps whole groups at 8 bits. One full-precision forward records every
layer's input; each group then reruns only the layers from its own onwards. Results are cached by
model, calibration set and scheme, so the candidates of `quantkit auto` share one measurement.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from quantkit.artifact import Sensitivity, SensitivityRun
from quantkit.quantize.families import Family
from quantkit.quantize.layers import UPGRADE_BITS, QuantSpec, linear
from quantkit.quantize.numerics import fake_quantize


def token_batch(samples: list[list[int]], n_tokens: int) -> torch.Tensor:
    """About `n_tokens` calibration tokens as one [rows, length] batch of equal-length rows."""
    length = min(n_tokens, min(len(s) for s in samples))
    rows = min(len(samples), -(-n_tokens // length))
    return torch.tensor([s[:length] for s in samples[:rows]])


@torch.no_grad()
def group_sensitivity(lm: nn.Module, family: Family, ids: torch.Tensor, spec: QuantSpec,
                      dev: torch.device) -> dict[str, float]:
    """{group key: mean per-token KL in nats} for every linear group of `lm` (left on the CPU)."""
    parent, attr = family.layers_attr.rsplit(".", 1)
    owner = lm.get_submodule(parent)
    layers = cast(nn.ModuleList, lm.get_submodule(family.layers_attr))
    lm.to(dev)
    ids = ids.to(dev)
    inputs: dict[int, torch.Tensor] = {}

    def keep(i: int):
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            inputs[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return hook

    handles = [layer.register_forward_pre_hook(keep(i), with_kwargs=True)
               for i, layer in enumerate(layers)]
    try:
        base = lm(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    finally:
        for h in handles:
            h.remove()
    p = base.exp()  # once: each group's KL then reuses it (2.6x faster on the demo's vocabulary)
    out: dict[str, float] = {}
    try:
        for key, i, step in family.group_keys(len(layers)):
            mods = [linear(layers[i], n) for n in step]
            saved = [m.weight.data for m in mods]
            for m in mods:
                m.weight.data = fake_quantize(m.weight.data, spec.bits, spec.group_size, spec.sym)
            # the layers from i on, fed layer i's recorded input (rotary and mask are rebuilt
            # from its positions): what quantizing this group alone changes downstream
            setattr(owner, attr, nn.ModuleList(list(layers)[i:]))
            try:
                logits = lm(inputs_embeds=inputs[i], use_cache=False).logits.float()
            finally:
                setattr(owner, attr, layers)
                for m, w in zip(mods, saved):
                    m.weight.data = w
            log_q = logits.log_softmax(-1)
            kl = torch.einsum("...v,...v->...", p, log_q.sub_(base).neg_())  # sum p (log p - log q)
            out[key] = float(kl.mean())
    finally:
        lm.to("cpu")
    return out


def cached_sensitivity(lm: nn.Module, family: Family, samples: list[list[int]], spec: QuantSpec,
                       dev: torch.device, n_tokens: int, source_sha: str, calib_sha: str,
                       dtype: str, upgrade_count: Callable[[int], int]) -> Sensitivity:
    """`group_sensitivity` with its provenance, computed once per model, calibration set,
    scheme and compute dtype (`lm`'s) under $QUANTKIT_HOME/sensitivity, and the groups chosen
    for 8 bits: the `upgrade_count(groups)` most sensitive (`upgraded`, `upgrade_bits`)."""
    from quantkit.fsutil import atomic_write_text, dumps
    from quantkit.models import quantkit_home

    def chosen(run: SensitivityRun, cached: bool) -> Sensitivity:
        upgraded = most_sensitive(run["kld"], upgrade_count(len(run["kld"])))
        return {**run, "cached": cached, "upgraded": list(upgraded), "upgrade_bits": UPGRADE_BITS}

    key = {"source_sha256": source_sha, "calib_sha256": calib_sha, "bits": spec.bits,
           "group_size": spec.group_size, "sym": spec.sym, "tokens": n_tokens, "dtype": dtype}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = quantkit_home() / "sensitivity" / f"{digest}.json"
    if path.is_file():
        cached: SensitivityRun = json.loads(path.read_text())
        return chosen(cached, True)
    t = time.time()
    ids = token_batch(samples, n_tokens)
    kld = group_sensitivity(lm, family, ids, spec, dev)
    result: SensitivityRun = {
        "source_sha256": source_sha, "calib_sha256": calib_sha, "bits": spec.bits,
        "group_size": spec.group_size, "sym": spec.sym, "tokens": int(ids.numel()),
        "dtype": dtype,
        "measure": "mean per-token KL(original || this group alone RTN-quantized)",
        "kld": kld, "seconds": round(time.time() - t, 2)}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dumps(result))
    return chosen(result, False)


def most_sensitive(kld: dict[str, float], k: int) -> tuple[str, ...]:
    """The k group keys with the largest KL, in model order."""
    top = set(sorted(kld, key=lambda g: -kld[g])[:k])
    return tuple(g for g in kld if g in top)
