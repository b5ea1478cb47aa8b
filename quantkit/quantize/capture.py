"""The calibration activations a decoder layer sees: the model run up to its first layer, in
batches of equal-length samples (no padding, so no attention mask)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from quantkit.quantize.layers import Batch


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
                   batch_tokens: int, keep: Callable[[Tensor], Tensor] = lambda t: t
                   ) -> list[Batch]:
    """Run the model up to its first decoder layer; keep that layer's inputs for every batch
    (each through `keep` as it comes: to disk, when the activations wait there).

    Samples of equal length are batched (no padding, so no attention mask is needed).
    """
    import torch

    from quantkit.quantize.layers import _Stop

    layers = lm.get_submodule(layers_attr)
    _move_all_but(lm, layers, device)  # embeddings, rotary tables: what runs before layer 0
    captured: list[Batch] = []

    # a forward pre-hook's keyword arguments: whatever the model passes its layers (open)
    def hook(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        kw = {k: v for k, v in kwargs.items()
              if not (k in ("past_key_values", "past_key_value", "cache") or "Cache" in type(v).__name__)}
        kw["use_cache"] = False
        captured.append((keep(hidden), kw))
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


def next_inputs(outs: list[Tensor], batches: list[Batch]) -> list[Batch]:
    """The next decoder layer's inputs: this layer's outputs with the same keyword arguments
    (positions, rotary tables) per batch."""
    return [(o, kw) for o, (_, kw) in zip(outs, batches)]


def _move_all_but(lm: Any, keep: Any, device: Any) -> None:
    """Move every parameter and buffer of `lm` outside the module `keep` to `device`."""
    kept = {id(m) for m in keep.modules()}
    for mod in lm.modules():
        if id(mod) not in kept:
            for p in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
                p.data = p.data.to(device)
