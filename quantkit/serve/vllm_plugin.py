"""Loaded inside vLLM's processes: the `dual` W4A16 kernel, Marlin at small batches and Machete at
large ones, from one server (`quantkit serve --kernel dual`).

vLLM picks one weight-only kernel per layer when it loads a model and keeps it for every step:
Marlin is the faster at a few tokens per step, Machete (Hopper) at many, so a server tuned for one
load is slow at the other. This kernel keeps each layer's 4-bit weights in both layouts (the
weights' memory twice: +4 GiB for an 8B model) and runs, per step, the one measured faster for
that step's token count on this GPU and this layer's shape (each shape timed once, at load, over
`GRID`). The token count is fixed in each captured CUDA graph, so a decode step pays nothing for
the choice; the choice sits inside one custom op, which torch.compile calls but does not trace.

vLLM runs `register` in each of its processes (entry point `vllm.general_plugins` in
pyproject.toml); it does something only where `QUANTKIT_VLLM_KERNEL=dual` (set by `quantkit serve
--kernel dual`): it adds the kernel through vLLM's `register_linear_kernel` and puts it first, so
vLLM's own choice is the fallback for a layer it cannot take (act-order, zero points, shapes
Machete refuses). Nothing of vLLM is patched: both kernels are vLLM's own classes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV = "QUANTKIT_VLLM_KERNEL"
SWITCH_ENV = "QUANTKIT_DUAL_SWITCH"  # tokens per step up to which Marlin runs (skips the timing)
GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # tokens per step timed at load
FLUSH_BYTES = 256 << 20  # written before each timed call: more than any GPU's L2 cache
OP_NAME = "quantkit_dual_w4a16"
log = logging.getLogger("vllm.quantkit_dual")  # under vLLM's logger: its handler prints INFO

_LAYERS: list[tuple[Any, Any]] = []  # (kernel, layer) by the index the custom op is given
_SWITCH: dict[tuple[int, int, int], int] = {}  # (K, N, group) -> largest token count for Marlin


def register() -> None:
    """vLLM's general-plugin hook: the dual kernel first in vLLM's W4A16 list, when asked for."""
    if os.environ.get(ENV) != "dual":
        return
    import torch
    from vllm.model_executor.kernels.linear import _POSSIBLE_KERNELS, register_linear_kernel
    from vllm.platforms import PlatformEnum
    from vllm.utils.torch_utils import direct_register_custom_op

    kernel = _kernel_class()
    for fn in (_dual_mm, _dual_mm_fake):  # the op's schema is read from real types
        fn.__annotations__ = {"x": torch.Tensor, "index": int, "return": torch.Tensor}
    direct_register_custom_op(OP_NAME, _dual_mm, fake_impl=_dual_mm_fake)
    register_linear_kernel(kernel, PlatformEnum.CUDA)
    kernels = _POSSIBLE_KERNELS[PlatformEnum.CUDA]
    kernels.insert(0, kernels.pop(kernels.index(kernel)))


def _dual_mm(x: Any, index: int) -> Any:
    kernel, layer = _LAYERS[index]
    return kernel.run(layer, x)


def _dual_mm_fake(x: Any, index: int) -> Any:
    kernel, _ = _LAYERS[index]
    return x.new_empty((*x.shape[:-1], kernel.config.partition_weight_shape[1]))


def choose_switch(marlin_ms: dict[int, float], machete_ms: dict[int, float]) -> int:
    """The largest token count up to which Marlin was faster at every size timed (0: never)."""
    switch = 0
    for m in sorted(marlin_ms):
        if marlin_ms[m] > machete_ms[m]:
            break
        switch = m
    return switch


def _kernel_class() -> type:
    import torch
    from vllm.model_executor.kernels.linear import MacheteLinearKernel, MarlinLinearKernel
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel

    class _Holder:
        """Machete's copy of a layer's tensors, under the layer's own names."""

    class QuantkitDualLinearKernel(MPLinearKernel):  # vLLM logs "Using QuantkitDual..."
        @classmethod
        def get_min_capability(cls) -> int:
            return 90

        @classmethod
        def can_implement(cls, c: Any) -> tuple[bool, str | None]:
            if c.has_g_idx or c.zero_points:
                return False, "dual: symmetric weights without act-order only"
            for k in (MarlinLinearKernel, MacheteLinearKernel):
                ok, why = k.can_implement(c)
                if not ok:
                    return False, f"dual: {k.__name__}: {why}"
            return True, None

        def __init__(self, c: Any, *names: Any, **kw: Any) -> None:
            super().__init__(c, *names, **kw)
            self.marlin = MarlinLinearKernel(c, *names, **kw)
            self.machete = MacheteLinearKernel(c, *names, **kw)
            self.index = -1
            self.switch = 0

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            names = [n for n in (self.w_q_name, self.w_s_name) if getattr(layer, n, None) is not None]
            params = {n: getattr(layer, n) for n in names}
            raw = {n: (p.data, {a: getattr(p, a) for a in ("_input_dim", "_output_dim", "_packed_dim")
                                if hasattr(p, a)}) for n, p in params.items()}
            bias = getattr(layer, "bias", None)
            holder = _Holder()
            holder.bias = None if bias is None else bias.data.clone()  # type: ignore[attr-defined]
            self.machete.process_weights_after_loading(layer)  # re-registers plain Parameters
            for n, p in params.items():
                setattr(holder, n, getattr(layer, n))
                p.data, meta = raw[n]  # the loaded layout again, for Marlin
                for a, v in meta.items():
                    setattr(p, a, v)
                layer.register_parameter(n, p)
            self.marlin.process_weights_after_loading(layer)
            layer.__dict__["_quantkit_machete"] = holder  # a plain attribute, not a submodule
            self.switch = self._switch(layer)
            self.index = len(_LAYERS)
            _LAYERS.append((self, layer))

        def run(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            tokens = x.numel() // x.shape[-1]
            if tokens <= self.switch:
                return self.marlin.apply_weights(layer, x, getattr(layer, "bias", None))
            holder: Any = layer.__dict__["_quantkit_machete"]
            return self.machete.apply_weights(holder, x, holder.bias)

        def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
            return getattr(torch.ops.vllm, OP_NAME)(x, self.index)  # bias: run() adds its own

        def _switch(self, layer: torch.nn.Module) -> int:
            if os.environ.get(SWITCH_ENV):
                return int(os.environ[SWITCH_ENV])
            k, n = self.config.partition_weight_shape
            key = (k, n, self.config.group_size)
            if key not in _SWITCH:
                times = {name: {m: self._time(layer, m, k, marlin) for m in GRID}
                         for name, marlin in (("marlin", True), ("machete", False))}
                _SWITCH[key] = choose_switch(times["marlin"], times["machete"])
                torch.cuda.empty_cache()  # the timing's graphs and buffers: not the KV cache's
                log.info("quantkit dual kernel: K=%d N=%d: Marlin up to %d tokens per step "
                         "(Marlin ms %s; Machete ms %s)", k, n, _SWITCH[key],
                         _fmt(times["marlin"]), _fmt(times["machete"]))
            return _SWITCH[key]

        def _time(self, layer: torch.nn.Module, m: int, k: int, marlin: bool, reps: int = 20
                  ) -> float:
            """Milliseconds per call as the server runs it: replayed from a CUDA graph (no launch
            cost), with L2 flushed before each call (a layer's weights come from HBM in a
            step: the other layers' have evicted them)."""
            device = layer.__dict__["_quantkit_machete"].__dict__[self.w_q_name].device
            x = torch.randn(m, k, dtype=self.config.act_type, device=device)
            flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
            saved, self.switch = self.switch, (m if marlin else 0)
            try:
                with_call = _graph_ms(lambda: (flush.zero_(), self.run(layer, x)), reps)
                flush_only = _graph_ms(lambda: flush.zero_(), reps)
                return max(with_call - flush_only, 0.0) / reps
            finally:
                self.switch = saved

    return QuantkitDualLinearKernel


def _graph_ms(step: Any, reps: int) -> float:
    """The fastest of three replays of a CUDA graph of `reps` calls of `step`, in milliseconds."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capturing stream, as CUDA graphs require
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            step()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, float(start.elapsed_time(end)))
    del graph
    return best


def _fmt(times: dict[int, float]) -> str:
    return " ".join(f"{m}:{t:.4f}" for m, t in times.items())
