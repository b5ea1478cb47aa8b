"""Fixtures the quantization tests share: the full-precision loader, and the in-memory run of our
layer loop that artifacts are checked against (the tiny llama's calibration set, `tiny_calib`, is
in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from quantkit.methods import layer_quantizer
from quantkit.quantize.capture import capture_inputs
from quantkit.quantize.families import LLAMA_LIKE
from quantkit.quantize.layers import QuantSpec, run_layer


def load_fp(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def fp_model() -> Callable[[Path], Any]:
    """A model folder loaded in float32 for comparison."""
    return load_fp


@pytest.fixture(scope="session")
def in_memory() -> Callable[[Path, list[list[int]], QuantSpec], Any]:
    """The model quantized in memory by the engine quantize() uses, layer by layer."""
    def run(path: Path, samples: list[list[int]], spec: QuantSpec) -> Any:
        model = load_fp(path)
        batches = capture_inputs(model, "model.layers", samples, torch.device("cpu"), 4096)
        for i, layer in enumerate(model.model.layers):
            layer_quantizer(spec.method)(layer, LLAMA_LIKE, batches, spec, i)
            batches = [(o, kw) for o, (_, kw) in zip(run_layer(layer, batches), batches)]
        return model
    return run
