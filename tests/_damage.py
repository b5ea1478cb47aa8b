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
