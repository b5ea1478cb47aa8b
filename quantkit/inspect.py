"""`quantkit inspect`: describe a model, a calibration set or an artifact without loading weights."""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from quantkit.artifact import MANIFEST, Manifest
from quantkit.errors import BadInput
from quantkit.fsutil import read_json_file

_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BadInput(f"{path} is not a safetensors file (too short)", "re-save the model")
        (size,) = struct.unpack("<Q", raw)
        try:
            header: dict[str, Any] = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path} has a corrupt safetensors header", "re-save the model") from exc
    header.pop("__metadata__", None)
    return header


def inspect_path(target: str) -> dict[str, Any]:
    """Summarise whatever `target` is: a calibration set, an artifact or a model spec."""
    path = Path(target)
    if (path / "samples.jsonl").is_file() and (path / "manifest.json").is_file():
        return inspect_calib_set(path)
    if (path / MANIFEST).is_file():
        return inspect_artifact(path)
    from quantkit.models import resolve_model

    return inspect_model(resolve_model(target).path)


def inspect_artifact(path: Path) -> dict[str, Any]:
    """The artifact's manifest; with --w8-groups, its linear groups ranked by sensitivity."""
    manifest = Manifest.read(path).to_dict()
    sens = manifest.get("sensitivity") or {}
    upgraded = set(sens.get("upgraded", []))
    bits = manifest.get("parameters", {}).get("bits")
    ranked = [{"group": g, "kld": v, "bits": sens.get("upgrade_bits") if g in upgraded else bits}
              for g, v in sorted(sens.get("kld", {}).items(), key=lambda kv: -kv[1])]
    return {"kind": "artifact", **manifest,
            **({"sensitivity_ranked": ranked} if ranked else {})}


def sensitivity_table(res: dict[str, Any], top: int = 20) -> str:
    """The most sensitive linear groups as text: group, KL it alone adds, bits it got."""
    ranked = res.get("sensitivity_ranked") or []
    if not ranked:
        return ""
    sens = res["sensitivity"]
    lines = [f"linear groups by the KL their {res['parameters']['bits']}-bit quantization alone "
             f"adds ({sens['tokens']} calibration tokens; {len(sens['upgraded'])} of "
             f"{len(ranked)} kept at {sens['upgrade_bits']} bits):"]
    lines += [f"  {r['group']:<14} {r['kld']:.5f}  W{r['bits']}" for r in ranked[:top]]
    if len(ranked) > top:
        lines.append(f"  ... {len(ranked) - top} more in --json")
    return "\n".join(lines)


def inspect_model(path: Path) -> dict[str, Any]:
    """Architecture, parameter count, dtypes, size, layer shapes, chat template, quantization."""
    config = json.loads((path / "config.json").read_text())
    files = sorted(path.glob("*.safetensors"))
    tensors: dict[str, Any] = {}
    for f in files:
        tensors.update(safetensors_header(f))
    params = sum(_numel(t["shape"]) for t in tensors.values())
    dtypes = Counter(t["dtype"] for t in tensors.values())
    shapes: dict[str, list[int]] = {}
    for name, t in tensors.items():
        generic = re.sub(r"\.\d+\.", ".N.", name)
        if generic.endswith(".weight") and len(t["shape"]) == 2:
            shapes.setdefault(generic, t["shape"])
    chat = (path / "chat_template.jinja").is_file() or "chat_template" in _json_or_empty(
        path / "tokenizer_config.json")
    quant = config.get("quantization_config")
    return {
        "kind": "model", "path": str(path),
        "architecture": (config.get("architectures") or ["?"])[0],
        "model_type": config.get("model_type"),
        "parameters": params, "dtypes": dict(dtypes),
        "size_bytes": sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
        "hidden_size": config.get("hidden_size"), "layers": config.get("num_hidden_layers"),
        "linear_shapes": shapes, "chat_template": chat,
        "quantized": bool(quant),
        "quantization": {k: quant.get(k) for k in ("quant_method", "format") if k in quant}
        if quant else None,
    }


def inspect_calib_set(path: Path) -> dict[str, Any]:
    """Manifest and stats of a calibration set folder."""
    hint = "rebuild it with `quantkit calibrate --force`"
    manifest, stats = (read_json_file(path / name, f"calibration set {path} has no {name}", hint,
                                      hint) for name in ("manifest.json", "stats.json"))
    try:
        return {"kind": "calibration_set", "path": str(path),
                "samples": manifest["counts"]["samples"], "tokens": manifest["counts"]["tokens"],
                "sources": manifest["sources"], "mix": stats["mix"],
                "token_length": stats["token_length"], "target_match": stats.get("target_match"),
                "tokenizer": manifest["tokenizer"]}
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadInput(f"calibration set {path} has an incomplete manifest.json or stats.json "
                       f"({type(exc).__name__}: {exc})", hint) from None


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _json_or_empty(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
