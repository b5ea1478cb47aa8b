"""How close one user's decode comes to the memory bandwidth it needs: a decode step at batch 1
reads every weight once (the input embedding only for the row it looks up) and the KV cache of
the context so far, so `bytes / bandwidth` is the fastest a token can come, and the measured time
per output token (TPOT) is that floor divided by the share of the bandwidth the engine reached.

Pure and torch-free: the weights are read from the safetensors headers (a file's eight-byte
header length and JSON table give each tensor's byte range), the KV cache from config.json, the
bandwidth from the GPU's name (the vendors' published peak of each card)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.records import BenchRow, RooflineRecord

# (a part of the name nvidia-smi reports, peak memory bandwidth in TB/s from the vendor's data
# sheet), the more specific first: an H100 is the SXM card's 3.35 unless the name says PCIe/NVL
BANDWIDTH_TBS: tuple[tuple[str, float], ...] = (
    ("GH200", 4.9), ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35),
    ("H800", 3.35), ("H20", 4.0), ("B200", 8.0), ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935), ("A100", 1.555), ("L40S", 0.864), ("L40", 0.864),
    ("L4", 0.3), ("A10G", 0.6), ("A10", 0.6), ("RTX 4090", 1.008))
EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


def bandwidth(gpu_name: str) -> float | None:
    """The card's peak memory bandwidth in TB/s, or None for a card not in the table."""
    return next((tbs for part, tbs in BANDWIDTH_TBS if part.lower() in gpu_name.lower()), None)


@dataclass(frozen=True)
class Roofline:
    """One user's decode step against its bandwidth floor (bytes, seconds, TB/s)."""

    gpu: str
    bandwidth_tbs: float
    weight_bytes: int  # read per token: every weight, the input embedding's one row
    kv_bytes: int  # the KV cache of `context` tokens
    context: int
    floor_s: float  # (weight_bytes + kv_bytes) at the card's bandwidth
    tpot_s: float  # measured
    share: float  # floor_s / tpot_s: the share of the bandwidth reached

    def to_dict(self) -> RooflineRecord:
        return {"gpu": self.gpu, "bandwidth_tbs": self.bandwidth_tbs,
                "weight_bytes": self.weight_bytes, "kv_bytes": self.kv_bytes,
                "context": self.context, "floor_s": self.floor_s, "tpot_s": self.tpot_s,
                "share": self.share}

    def sentence(self) -> str:
        gb = (self.weight_bytes + self.kv_bytes) / 1e9
        return (f"roofline at 1 user: {self.tpot_s * 1e3:.2f} ms a token against the "
                f"{self.floor_s * 1e3:.2f} ms that reading {gb:.2f} GB (weights, and the KV cache "
                f"of {self.context} tokens) takes at {self.bandwidth_tbs} TB/s ({self.gpu}): "
                f"{self.share:.0%} of the bandwidth")


def tensor_bytes(folder: Path) -> dict[str, int]:
    """Each tensor's stored bytes, from the headers of the folder's safetensors files ({} where
    it has none)."""
    sizes: dict[str, int] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with shard.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                start, end = meta["data_offsets"]
                sizes[name] = end - start
    return sizes


def weight_bytes_read(folder: Path, config: dict[str, Any]) -> int | None:
    """The bytes one decode step reads of the weights: all of them, but of an input embedding
    that is not also the output layer only the row looked up. None without safetensors."""
    sizes = tensor_bytes(folder)
    if not sizes:
        return None
    total = sum(sizes.values())
    tied = config.get("tie_word_embeddings", False)
    vocab = int(config.get("vocab_size") or 0)
    for name, size in sizes.items():
        if name.endswith(EMBEDDINGS) and not tied and vocab:
            total -= size - size // vocab
    return total


def kv_bytes_per_token(config: dict[str, Any], kv_dtype_bytes: float) -> int | None:
    """Keys and values of every layer for one token (grouped-query attention's KV heads), or None
    for a config without the usual fields (multi-head latent attention, say)."""
    cfg = config.get("text_config") or config
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None
    return int(2 * layers * kv_heads * head_dim * kv_dtype_bytes)


def served_roofline(card: dict[str, Any], records: Sequence[Any], levels: Sequence[BenchRow],
                    gpu_name: str | None) -> Roofline | None:
    """`quantkit bench`'s roofline: the served model's folder from its card (quantkit serve's,
    on this machine), the context its requests averaged while decoding (prompt and half the
    output), one user's TPOT p50. None where any is unknown."""
    info = card.get("quantkit") or {}
    folder = Path(str(info.get("artifact") or ""))
    one = next((r for r in levels if r.get("concurrency") == 1), None)
    tpot = (one.get("tpot_s") or {}).get("p50") if one else None
    ok = [r for r in records if r.error is None and r.prompt_tokens]
    if not gpu_name or not info.get("artifact") or not folder.is_dir() or not tpot or not ok:
        return None
    context = round(sum(r.prompt_tokens + r.output_tokens / 2 for r in ok) / len(ok))
    return roofline(folder, gpu_name, context, float(tpot),
                    str(info.get("kv_cache_dtype") or "auto"))


def roofline(folder: Path, gpu_name: str, context: int, tpot_s: float,
             kv_cache_dtype: str = "auto") -> Roofline | None:
    """The floor of one user's decode step for the model in `folder` on `gpu_name`, against the
    measured `tpot_s`; None where a fact is missing (no safetensors, no config, a card not in
    the table, no TPOT)."""
    tbs = bandwidth(gpu_name)
    config_file = folder / "config.json"
    if tbs is None or not tpot_s or tpot_s <= 0 or not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    weights = weight_bytes_read(folder, config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    per_token = kv_bytes_per_token(config, 1 if kv_cache_dtype.startswith("fp8")
                                   else 4 if dtype == "float32" else 2)
    if weights is None or per_token is None:
        return None
    kv = per_token * context
    floor = (weights + kv) / (tbs * 1e12)
    return Roofline(gpu_name, tbs, weights, kv, context, floor, tpot_s, floor / tpot_s)
