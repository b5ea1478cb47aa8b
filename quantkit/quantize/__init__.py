"""`quantize()`: a model and a calibration set -> an artifact. Dispatch only: GPTQ and AWQ run
layer by layer (`layerwise`) into a compressed-tensors checkpoint, GGUF k-quants through llama.cpp
(`gguf`)."""

from __future__ import annotations

from pathlib import Path

from quantkit.artifact import Manifest
from quantkit.recipe import QuantizeConfig


def quantize(*, model: str, cfg: QuantizeConfig, calib: Path, out: Path, resume: bool = False,
             force: bool = False) -> Manifest:
    """Quantize `model` as `cfg` says with the calibration set `calib`; write the artifact folder
    `out` (complete or not at all); return its manifest."""
    cfg.check()
    if cfg.method == "gguf":
        from quantkit.quantize.gguf import quantize_gguf

        return quantize_gguf(model=model, cfg=cfg, calib=Path(calib), out=Path(out), force=force)
    from quantkit.quantize.layerwise import quantize_layerwise

    return quantize_layerwise(model=model, cfg=cfg, calib=Path(calib), out=Path(out),
                              resume=resume, force=force)
