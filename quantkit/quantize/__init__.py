"""`quantize()`: a model and a calibration set -> an artifact. Dispatch only, by the method
registry (quantkit.method_registry): GPTQ and AWQ run layer by layer (`layerwise`) into a
compressed-tensors checkpoint, GGUF k-quants through llama.cpp (`gguf`)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from quantkit.artifact import Manifest
from quantkit.config import QuantizeConfig


class QuantizePipeline(Protocol):
    """A method's whole pipeline (`Method.quantize`, which `quantize()` calls), with quantize()'s
    keywords: the layer-by-layer engine's (quantize/layerwise.py) or a method's own (GGUF's)."""

    def __call__(self, *, model: str, cfg: QuantizeConfig, calib: Path, out: Path,
                 resume: bool, force: bool) -> Manifest: ...


def quantize(*, model: str, cfg: QuantizeConfig, calib: Path, out: Path, resume: bool = False,
             force: bool = False) -> Manifest:
    """Quantize `model` as `cfg` says with the calibration set `calib`; write the artifact folder
    `out` (complete or not at all); return its manifest."""
    from quantkit.method_registry import METHODS
    from quantkit.registry import load

    cfg.check()
    run: QuantizePipeline = load(METHODS[cfg.method].quantize)
    return run(model=model, cfg=cfg, calib=Path(calib), out=Path(out), resume=resume,
               force=force)
