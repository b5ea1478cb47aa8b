"""Calibration activations on disk: each batch's tensor in a memory-mapped file that is deleted
as soon as it is mapped, so the OS pages it in and out (no swap needed) and nothing is left
behind, whatever ends the process."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch import Tensor


def to_disk(t: Tensor, folder: Path) -> Tensor:
    """A CPU tensor equal to `t`, backed by an (already deleted) file in `folder`."""
    import torch

    fd, name = tempfile.mkstemp(prefix=".quantkit-activations-", dir=folder)
    os.close(fd)
    try:
        mapped = torch.from_file(name, shared=True, size=t.numel(), dtype=t.dtype)
    finally:
        os.unlink(name)
    return mapped.view(t.shape).copy_(t)


def keeper(folder: Path | None) -> Callable[[Tensor], Tensor]:
    """How layer inputs are kept: on disk in `folder`, or as they are (None)."""
    if folder is None:
        return lambda t: t
    return lambda t: to_disk(t, folder)
