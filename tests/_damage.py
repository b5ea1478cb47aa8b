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
