"""Models bigger than memory: the model's skeleton is built without weights, the tensors outside
the decoder layers (embeddings, final norm, output head) are read at once, and each decoder
layer's tensors are read from the safetensors shards when its turn comes (the next layer's in a
background thread) and dropped after it is quantized. CPU memory holds about one layer plus the
embeddings, not the whole model.

A layer's tensors are found under the names the checkpoint stores: the layer's own keys, or for
a mixture-of-experts layer the per-expert matrices its `Experts` record names, stacked into the
fused parameters. A checkpoint whose names need another of transformers' load-time conversions
is loaded whole instead (`open_skeleton` returns None).
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from quantkit.quantize.families import Family


class LayerReader:
    """Reads decoder layer i's parameters from the shards (`read`), one layer ahead (`prefetch`),
    into a skeleton layer (`materialize`), and drops them again (`release`)."""

    def __init__(self, path: Path, family: Family, dtype: torch.dtype):
        self.path, self.family, self.dtype = Path(path), family, dtype
        self.files = _tensor_files(self.path)
        self.pool = ThreadPoolExecutor(1)
        self.pending: dict[int, Future[dict[str, Tensor]]] = {}

    def sources(self, key: str, i: int) -> list[tuple[str, int, int, int]] | None:
        """Where layer i's parameter `key` comes from: (checkpoint key, expert, first row, last
        row) pieces (expert -1: the whole tensor); None when the checkpoint lacks it."""
        prefix = f"{self.family.layers_attr}.{i}."
        ex = self.family.experts
        if ex is not None and key in ex.fused_keys:
            param = key.rsplit(".", 1)[1]
            pieces = [(f"{prefix}{m.saved.format(e=e)}.weight", e, m.start, m.stop)
                      for m in ex.matrices if m.param == param for e in range(ex.count)]
        else:
            pieces = [(prefix + self.family.saved_key(key), -1, 0, 0)]
        return pieces if all(p[0] in self.files for p in pieces) else None

    def read(self, layer: nn.Module, i: int) -> dict[str, Tensor]:
        """Layer i's parameters, on the CPU in the work's dtype (fused experts stacked)."""
        from safetensors import safe_open

        plan = {key: self.sources(key, i) for key, _ in layer.named_parameters()}
        by_file: dict[str, list[str]] = {}
        for pieces in plan.values():
            for name, *_ in pieces or ():
                by_file.setdefault(self.files[name], []).append(name)
        raw: dict[str, Tensor] = {}
        for file, names in by_file.items():
            with safe_open(str(self.path / file), "pt") as f:
                for name in names:
                    raw[name] = f.get_tensor(name)
        state: dict[str, Tensor] = {}
        for key, pieces in plan.items():
            assert pieces is not None  # open_skeleton checked every layer's keys
            if pieces[0][1] < 0:
                state[key] = _cast(raw[pieces[0][0]], self.dtype)
                continue
            p = layer.get_parameter(key)
            out = torch.empty(p.shape, dtype=self.dtype)
            for name, e, start, stop in pieces:
                out[e, start:stop] = raw[name]
            state[key] = out
        return state

    def prefetch(self, layer: nn.Module, i: int) -> None:
        if i not in self.pending:
            self.pending[i] = self.pool.submit(self.read, layer, i)

    def materialize(self, layer: nn.Module, i: int, device: Any) -> None:
        """Put layer i's parameters into the skeleton layer, on `device`."""
        future = self.pending.pop(i, None)
        state = future.result() if future is not None else self.read(layer, i)
        layer.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=False,
                              assign=True)
        left = [n for n, p in layer.named_parameters() if p.is_meta]
        if left:
            raise RuntimeError(f"layer {i}: {left[0]} was not read from the checkpoint")

    @staticmethod
    def release(layer: nn.Module) -> None:
        """Drop the layer's weights (back to the skeleton's meta tensors)."""
        layer.to("meta")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def open_skeleton(path: Path, family: Family, dtype: str) -> tuple[Any, LayerReader] | None:
    """The model without decoder-layer weights (everything else read from the shards) and the
    reader of its layers; None when a layer's or the rest's tensors are not found under the
    names this reader knows (the caller loads the model whole)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        lm = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    lm.eval()
    reader = LayerReader(path, family, torch_dtype)
    layers = lm.get_submodule(family.layers_attr)
    if not all(reader.sources(key, i) for i, layer in enumerate(layers)
               for key, _ in layer.named_parameters()):
        reader.close()
        return None
    prefix = family.layers_attr + "."
    tied = bool(getattr(lm.config, "tie_word_embeddings", False))
    rest = [k for k, _ in lm.named_parameters() if not k.startswith(prefix)
            and not (tied and k == "lm_head.weight")]
    if not all(k in reader.files for k in rest):
        reader.close()
        return None
    from safetensors import safe_open

    state: dict[str, Tensor] = {}
    for file in sorted({reader.files[k] for k in rest}):
        with safe_open(str(path / file), "pt") as f:
            state.update({k: _cast(f.get_tensor(k), torch_dtype) for k in rest
                          if reader.files[k] == file})
    lm.load_state_dict(state, strict=False, assign=True)
    if tied:
        lm.tie_weights()
    return lm, reader


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def _tensor_files(path: Path) -> dict[str, str]:
    """Every tensor's shard file in a model folder."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    from quantkit.models import safetensors_header

    return {k: f.name for f in sorted(path.glob("*.safetensors"))
            for k in safetensors_header(f) if k != "__metadata__"}
