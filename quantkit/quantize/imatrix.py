"""The importance matrix from a calibration set, in llama.cpp's GGUF imatrix format.

For every weight that llama.cpp quantizes, the sum of squared input activations per input
channel (`<name>.in_sum2`) and the number of tokens behind it (`<name>.counts`), collected with
forward hooks in PyTorch; llama-quantize divides one by the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHUNK = 512  # llama-imatrix's default chunk size; recorded as imatrix.chunk_size


def collect(model: Any, samples: list[list[int]], batch_tokens: int = 8192) -> tuple[
        dict[str, Any], int]:
    """Per HF weight name of the decoder layers: float64 sums of x^2 per input channel; tokens."""
    import torch

    sums: dict[str, Any] = {}
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            def hook(_m: Any, args: tuple[Any, ...], key: str = f"{name}.weight") -> None:
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                acc = torch.einsum("ti,ti->i", x, x)
                sums[key] = sums[key] + acc.double() if key in sums else acc.double()
            handles.append(mod.register_forward_pre_hook(hook))
    from quantkit.quantize import length_batches

    tokens = 0
    try:
        with torch.no_grad():
            for batch in length_batches(samples, batch_tokens):
                ids = torch.tensor(batch)
                # the base model only: llama-imatrix leaves the output head out by default, and
                # skipping it saves the logits
                model.model(input_ids=ids)
                tokens += ids.numel()
    finally:
        for h in handles:
            h.remove()
    return sums, tokens


def write(path: Path, sums: dict[str, Any], tokens: int, gguf_names: dict[str, str],
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
    reader = gguf.GGUFReader(str(f16_gguf))
    field = reader.fields["general.architecture"]
    arch_name = bytes(field.parts[field.data[0]]).decode()
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    blocks_field = reader.fields[f"{arch_name}.block_count"]
    n_blocks = int(blocks_field.parts[blocks_field.data[0]][0])
    table = gguf.get_tensor_name_map(arch, n_blocks)
    present = {t.name for t in reader.tensors}
    out: dict[str, str] = {}
    for hf in hf_names:
        name = table.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is not None and name in present:
            out[hf] = name
    return out
