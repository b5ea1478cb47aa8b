"""The importance matrix from a calibration set, in llama.cpp's GGUF imatrix format.

For every weight that llama.cpp quantizes, the sum of squared input activations per input
channel (`<name>.in_sum2`) and the number of tokens behind it (`<name>.counts`), collected with
forward hooks in PyTorch; llama-quantize divides one by the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

CHUNK = 512  # llama-imatrix's default chunk size; recorded as imatrix.chunk_size


def collect(model: Any, samples: list[list[int]], batch_tokens: int = 1024) -> tuple[
        dict[str, Tensor], int]:
    """Per HF weight name of the decoder layers: float64 sums of x^2 per input channel; tokens.

    Small batches keep the CPU's caches warm (1024 tokens ran 1.6x faster than 8192 here); the
    projections that share one input (q/k/v, gate/up) square it once.
    """
    import torch

    sums: dict[str, Tensor] = {}
    last: list[Any] = [None, None]  # the previous hook's input and its sum of squares
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            def hook(_m: Any, args: tuple[Any, ...], key: str = f"{name}.weight") -> None:
                if args[0] is not last[0]:
                    x = args[0].reshape(-1, args[0].shape[-1]).float()
                    last[:] = [args[0], (x * x).sum(0).double()]  # einsum is 10-60x slower here
                sums[key] = sums[key] + last[1] if key in sums else last[1]
            handles.append(mod.register_forward_pre_hook(hook))
    from quantkit.quantize.capture import length_batches

    tokens = 0
    try:
        with torch.no_grad():
            for batch in length_batches(samples, batch_tokens):
                ids = torch.tensor(batch, device=model.device)
                # the base model only: llama-imatrix leaves the output head out by default, and
                # skipping it saves the logits
                model.model(input_ids=ids)
                tokens += ids.numel()
    finally:
        last[:] = [None, None]
        for h in handles:
            h.remove()
    return sums, tokens


def from_hessians(model_dir: Path, source_sha: str, samples: list[list[int]], cset_sha: str
                  ) -> tuple[dict[str, Tensor], int, str, str] | None:
    """`collect`'s sums without a pass, read off the Hessians that GPTQ's `--hessians original`
    kept on disk for this model and calibration set (its default batch size, on the CPU or a
    GPU, in any dtype): H = 2/n X^T X, so the sum of x^2 per channel is diag(H) * n / 2 for
    every linear reading that input. Returns (sums, tokens, the cache folder, the dtype of the
    pass), or None: no Hessians kept, a mixture of experts (the Hessians keep no expert's token
    count), or linears they miss."""
    import torch

    from quantkit.errors import BadInput
    from quantkit.quantize.hessians import BATCH_TOKENS, cache_key, read_cached
    from quantkit.quantize.structure import read_structure

    keys = [cache_key(source_sha, cset_sha, dev, BATCH_TOKENS[dev.split(":")[0]], dtype)
            for dev in ("cpu", "cuda", "cuda:0") for dtype in ("bfloat16", "float32", "float16")]
    hit, found = next(((k, f) for k in keys if (f := read_cached(k)) is not None), (None, None))
    if hit is None or found is None:
        return None
    try:  # a layout GPTQ refuses (GGUF takes it) has no Hessians to read anyway
        family = read_structure(model_dir)
        names = linear_names(model_dir)
    except (BadInput, ValueError, KeyError, OSError):
        return None
    if family.experts is not None:
        return None
    flat, folder = found
    tokens = sum(len(s) for s in samples)
    sums: dict[str, Tensor] = {}
    for key, h in flat.items():
        i, first = key.split(".", 1)
        step = next((st for st in family.sequential if st[0] == first), None)
        if step is None:
            return None
        channel = torch.diagonal(h).double() * (tokens / 2)
        for name in step:
            sums[f"{family.layers_attr}.{i}.{name}.weight"] = channel
    if set(sums) != set(names):
        return None
    return sums, tokens, folder, hit[-1]


def linear_names(model_dir: Path) -> list[str]:
    """The weights `collect` hooks: every nn.Linear but the output head, from the config alone
    (the model built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return [f"{name}.weight" for name, mod in lm.named_modules()
            if isinstance(mod, torch.nn.Linear) and name != "lm_head"]


def write(path: Path, sums: dict[str, Tensor], tokens: int, gguf_names: dict[str, str],
          datasets: list[str], gguf: Any) -> int:
    """Write the imatrix GGUF; return how many weights it covers."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_string("general.type", "imatrix")
    writer.add_array("imatrix.datasets", datasets)
    writer.add_uint32("imatrix.chunk_count", tokens // CHUNK)
    writer.add_uint32("imatrix.chunk_size", CHUNK)
    written = 0
    for hf_name in sorted(sums, key=lambda n: gguf_names.get(n, n)):
        name = gguf_names.get(hf_name)
        if name is None:
            continue
        values = sums[hf_name].cpu().numpy().astype(np.float32)
        # ggml shapes are {n_in, n_mat} and {1, n_mat}; numpy order is the reverse
        writer.add_tensor(f"{name}.in_sum2", values.reshape(1, -1))
        writer.add_tensor(f"{name}.counts", np.array([[tokens]], dtype=np.float32))
        written += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def gguf_name_map(f16_gguf: Path, hf_names: list[str], gguf: Any) -> dict[str, str]:
    """HF weight names -> GGUF tensor names, through llama.cpp's own TensorNameMap."""
    info = _gguf_layout(f16_gguf, gguf)
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == info.architecture)
    table = gguf.get_tensor_name_map(arch, info.block_count)
    present = set(info.tensors)
    out: dict[str, str] = {}
    for hf in hf_names:
        name = table.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is not None and name in present:
            out[hf] = name
    return out


@dataclass(frozen=True)
class GgufLayout:
    """What a GGUF's header says of its layout: llama.cpp's architecture name, its block
    (decoder layer) count, its tensors' names."""

    architecture: str
    block_count: int
    tensors: list[str]


def _gguf_layout(f16_gguf: Path, gguf: Any) -> GgufLayout:
    """Architecture, block count and tensor names of a GGUF (its header alone)."""
    from quantkit.gguf_header import read_header

    header = read_header(f16_gguf, gguf)
    arch_name = header.fields["general.architecture"]
    return GgufLayout(arch_name, int(header.fields[f"{arch_name}.block_count"]),
                      [t.name for t in header.tensors])
