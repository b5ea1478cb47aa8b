"""Damaged copies of artifacts, for tests that the gate and the KL see damage."""

from __future__ import annotations

import shutil
from pathlib import Path


def scramble_scales(src: Path, dst: Path, seed: int = 0) -> None:
    """Copy artifact `src` to `dst` with every layer's scales scaled per output row by
    U(0.3, 1.7): the model still loads and answers, but worse."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    for f in dst.glob("model-layer-*.safetensors"):
        tensors = load_file(f)
        for name, t in tensors.items():
            if name.endswith("weight_scale"):
                noise = torch.empty(t.shape[0], 1).uniform_(0.3, 1.7, generator=g)
                tensors[name] = (t.float() * noise).to(t.dtype).contiguous()
        save_file(tensors, f, metadata={"format": "pt"})


def swap_experts(src: Path, dst: Path, a: int = 0, b: int = 1) -> int:
    """Copy artifact `src` to `dst` with experts `a` and `b` of every layer exchanged (all
    their tensors): the checkpoint loads and answers, but the router's choices reach the wrong
    expert. Returns how many tensors moved."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    moved = 0
    for f in dst.glob("model-layer-*.safetensors"):
        tensors = load_file(f)
        swapped = {}
        for name, t in tensors.items():
            for x, y in ((a, b), (b, a)):
                if f".experts.{x}." in name:
                    name = name.replace(f".experts.{x}.", f".experts.{y}.")
                    moved += 1
                    break
            swapped[name] = t
        save_file(swapped, f, metadata={"format": "pt"})
    return moved


def silence_token(src: Path, dst: Path, token: str) -> int:
    """Copy artifact `src` to `dst` with the output row of `token` (its lm_head row) turned
    against itself: where the model would emit it, it now ranks it last. A thinking model so
    damaged never closes its thinking. Returns the token's id."""
    import json

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    added = json.loads((dst / "tokenizer.json").read_text())["added_tokens"]
    tid = next(t["id"] for t in added if t["content"] == token)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        if "lm_head.weight" in tensors:
            w = tensors["lm_head.weight"].clone()
            w[tid] = -4 * w[tid].float().to(w.dtype)
            tensors["lm_head.weight"] = w.contiguous()
            save_file(tensors, f, metadata={"format": "pt"})
    return tid
