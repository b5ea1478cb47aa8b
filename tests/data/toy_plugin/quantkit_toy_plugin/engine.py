"""An engine: transformers under another name (its adapter lives in `adapter`, which imports
torch, so that listing the engines does not). Without a `probe` its library must be installed
to be chosen; its server is `transformers serve`, so it borrows that probe and that capability."""

from __future__ import annotations

from quantkit.engines.choice import EngineSpec

TOY = EngineSpec("transformers-toy", "transformers", ("compressed-tensors",),
                 adapter="quantkit_toy_plugin.adapter:ToyEngine",
                 launch="quantkit.serve.engines.transformers:transformers_launch",
                 server_probe="quantkit.serve.engines.transformers:transformers_probe", decompresses=True)
