"""The toy engine's in-process adapter: quantkit's transformers adapter, renamed."""

from __future__ import annotations

from quantkit.engines.hf import TransformersEngine


class ToyEngine(TransformersEngine):
    name = "transformers-toy"
