"""Export of quantized weights in compressed-tensors' ``pack-quantized`` format.

Layout (compressed-tensors' PackedQuantizationCompressor): signed values ``q`` are offset by
``2**(bits-1)`` to unsigned nibbles and packed densely into int32 along the input dimension,
element ``k`` of each run of 8 at bits ``4k..4k+3``. Asymmetric zero points are packed the same
way but along the output dimension; symmetric schemes store no zero point.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from quantkit.errors import BadInput
from quantkit.quantize.numerics import num_groups, qrange


def pack_int4(q: Tensor) -> Tensor:
    """Pack signed int4 ``q[rows, cols]`` (in [-8, 7]) into int32 ``[rows, ceil(cols / 8)]``."""
    if q.ndim != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {tuple(q.shape)}")
    if q.is_floating_point():
        raise ValueError(f"expected an integer tensor, got {q.dtype}")
    rows, cols = q.shape
    u = q.to(torch.int32) + 8
    pad = -cols % 8
    if pad:
        # compressed-tensors pads the offset values with 0 nibbles
        u = torch.nn.functional.pad(u, (0, pad))
    u = u.view(rows, -1, 8)
    packed = u[..., 0].clone()
    for k in range(1, 8):
        # int32 wraps for the top nibble, which is exactly the two's-complement bit pattern
        packed |= u[..., k] << (4 * k)
    return packed


def unpack_int4(packed: Tensor, cols: int) -> Tensor:
    """Unpack int32 ``packed[rows, words]`` into signed int8 ``[rows, cols]``."""
    if packed.dtype != torch.int32 or packed.ndim != 2:
        raise ValueError(
            f"expected a 2-D int32 tensor, got {packed.dtype} {tuple(packed.shape)}"
        )
    if not (packed.shape[1] - 1) * 8 < cols <= packed.shape[1] * 8:
        raise ValueError(f"{packed.shape[1]} int32 words cannot hold {cols} int4 values")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF
    return (nibbles.flatten(1)[:, :cols] - 8).to(torch.int8)


def _pack(q: Tensor, bits: int) -> Tensor:
    """Pack along the last dim, with the library's general packer for widths other than 4."""
    if bits == 4:
        return pack_int4(q)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    return pack_to_int32(q.to(torch.int8), bits)


def to_compressed_tensors_state(
    name: str,
    q_int: Tensor,
    scale: Tensor,
    zero: Tensor | None,
    g_idx: Tensor | None,
    bits: int,
    group_size: int,
    sym: bool,
) -> dict[str, Tensor]:
    """Tensors PackedQuantizationCompressor writes for Linear ``name`` (scale kept as given)."""
    q_min, q_max = qrange(bits)
    if q_int.ndim != 2:
        raise ValueError(f"expected a 2-D q_int [out, in], got shape {tuple(q_int.shape)}")
    out_f, in_f = q_int.shape
    ng = num_groups(in_f, group_size)
    if tuple(scale.shape) != (out_f, ng):
        raise ValueError(f"scale shape {tuple(scale.shape)} != expected {(out_f, ng)}")
    if q_int.numel() and (q_int.min() < q_min or q_int.max() > q_max):
        raise ValueError(f"q_int values fall outside the {bits}-bit range [{q_min}, {q_max}]")
    if g_idx is not None:
        gs = in_f if group_size == -1 else group_size
        trivial = torch.arange(in_f, device=g_idx.device) // gs
        if not torch.equal(g_idx.long(), trivial):
            # compressed-tensors 0.20 removed actorder="group" and has no weight_g_idx tensor
            raise ValueError(
                "compressed-tensors cannot store a column permutation (g_idx); "
                "quantize with act_order static groups instead"
            )
    prefix = f"{name}." if name else ""
    state = {
        f"{prefix}weight_packed": _pack(q_int, bits).contiguous(),
        f"{prefix}weight_scale": scale.contiguous(),
        f"{prefix}weight_shape": torch.tensor([out_f, in_f]),
    }
    if not sym:
        if zero is None or tuple(zero.shape) != (out_f, ng):
            raise ValueError(
                f"asymmetric quantization needs a zero point of shape {(out_f, ng)}"
            )
        state[f"{prefix}weight_zero_point"] = _pack(zero.T, bits).T.contiguous()
    return state


def check_writer() -> None:
    """compressed-tensors, which writes the checkpoint's config at the end, imports whole (its
    own dependencies too): BadInput before the first layer, not after the last (the 8B recipe
    quantized 32 layers, then stopped at a missing loguru)."""
    try:
        from compressed_tensors.config import CompressionFormat  # noqa: F401
        from compressed_tensors.quantization import QuantizationConfig  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "compressed_tensors"
        raise BadInput(f"quantize writes a compressed-tensors checkpoint and importing "
                       f"compressed_tensors failed: {exc}",
                       f"pip install {missing.split('.')[0].replace('_', '-')} (or reinstall "
                       "quantkit with its dependencies)") from None


def quantization_config(
    bits: int, group_size: int, sym: bool, act_order: bool, ignore: list[str],
    upgraded: dict[int, list[str]] | None = None, float_weights: bool = False,
    inputs: dict[str, Any] | None = None, kv_cache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The config.json ``quantization_config`` entry, as ModelCompressor.update_config writes it.
    `upgraded`: more bits for the modules the targets name (regexes, which compressed-tensors
    and vLLM both rank above the class target ``Linear``), one config group per width.
    `float_weights`: E4M3 weights per channel (``float-quantized``, FP8 W8A8); `inputs`: the
    QuantizationArgs fields of quantized activations (FP8; None: 16-bit); `kv_cache`, those of
    the KV cache (its scales are the layers' k_scale / v_scale tensors)."""
    import compressed_tensors
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    qrange(bits)
    num_groups(group_size if group_size > 0 else 1, group_size)
    fmt = (CompressionFormat.float_quantized if float_weights
           else CompressionFormat.pack_quantized).value
    acts = QuantizationArgs(**inputs) if inputs else None

    def weights(num_bits: int) -> QuantizationArgs:
        if float_weights:
            from quantkit.fp8 import fp8_args

            return QuantizationArgs(**fp8_args("channel"))
        return QuantizationArgs(
            num_bits=num_bits,
            type="int",
            symmetric=sym,
            strategy="group" if group_size > 0 else "channel",
            group_size=group_size if group_size > 0 else None,
            dynamic=False,
            # "weight" (alias "static"): act-order during calibration only, no g_idx on disk
            actorder="weight" if act_order else None,
        )

    groups = {"group_0": QuantizationScheme(targets=["Linear"], weights=weights(bits),
                                            input_activations=acts, format=fmt)}
    for n, (more, targets) in enumerate(sorted((upgraded or {}).items()), start=1):
        qrange(more)
        groups[f"group_{n}"] = QuantizationScheme(targets=list(targets), weights=weights(more),
                                                  format=fmt)
    config = QuantizationConfig(
        config_groups=groups,
        format=fmt,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=list(ignore),
        kv_cache_scheme=QuantizationArgs(**kv_cache) if kv_cache else None,
    )
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **config.model_dump(mode="json", exclude={"quant_method"}),
    }
