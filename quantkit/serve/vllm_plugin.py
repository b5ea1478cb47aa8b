"""Loaded inside vLLM's processes: quantkit's two linear kernels, each chosen by `quantkit serve
--kernel`. `dual` (W4A16): Marlin at small batches and Machete at large ones, from one server.
`w4a8-tiles` (W4A8): vLLM's CUTLASS W4A8 kernel with its tile schedule chosen per layer shape and
token count by timing, where vLLM's heuristic picks one per shape from fixed rules. Served on an
H100 it was no faster than the heuristic (0.98x at one user, 1.00x at 64: docs/BENCHMARKS.md).

vLLM picks one weight-only kernel per layer when it loads a model and keeps it for every step:
Marlin is the faster at a few tokens per step, Machete (Hopper) at many, so a server tuned for one
load is slow at the other. This kernel keeps each layer's 4-bit weights in both layouts (the
weights' memory twice: +4 GiB for an 8B model) and runs, per step, the one measured faster for
that step's token count on this GPU and this layer's shape (each shape timed once, at load, over
`GRID`). The token count is fixed in each captured CUDA graph, so a decode step pays nothing for
the choice; the choice sits inside one custom op, which torch.compile calls but does not trace.

vLLM runs `register` in each of its processes (entry point `vllm.general_plugins` in
pyproject.toml); it does something only where `QUANTKIT_VLLM_KERNEL` names one of `KERNELS` (set
by `quantkit serve --kernel dual` or `--kernel w4a8-tiles`): it adds that kernel through vLLM's
`register_linear_kernel` and puts it first, so vLLM's own choice is the fallback for a layer it
cannot take (act-order, zero points, shapes Machete refuses). Nothing of vLLM is patched: the
kernels run vLLM's own classes and ops. Both sit inside one custom op, which torch.compile calls
but does not trace, and time their choices at load the same way (`_graph_ms`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV = "QUANTKIT_VLLM_KERNEL"
# the values of ENV this plugin acts on -> the name vLLM logs for the kernel ("Using ...LinearKernel")
KERNELS = {"dual": "QuantkitDual", "w4a8-tiles": "QuantkitW4A8Tiles"}
# ... and the scheme of artifact each takes (quantkit.serve.vllm_checks.scheme_of's names)
SCHEMES = {"dual": "weight-only int", "w4a8-tiles": "W4A8"}
SWITCH_ENV = "QUANTKIT_DUAL_SWITCH"  # tokens per step up to which Marlin runs (skips the timing)
GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # tokens per step timed at load
# W4A8: the schedules vLLM 0.26's CUTLASS W4A8 binary holds (bench/h200/w4a8_tiles.py found these
# ten; one a build lacks is skipped), the token counts timed, and how much faster than vLLM's own
# choice a schedule must be to replace it (less is timing noise)
W4A8_SCHEDULES = tuple(f"{t}_{c}" for t, c in (
    ("128x16", "1x1x1"), ("128x32", "1x1x1"), ("128x64", "1x1x1"), ("128x128", "1x1x1"),
    ("128x256", "1x1x1"), ("128x256", "2x1x1"), ("256x16", "1x1x1"), ("256x32", "1x1x1"),
    ("256x64", "1x1x1"), ("256x128", "1x1x1")))
W4A8_GRID = (1, 8, 16, 32, 48, 64, 96, 128, 256)
W4A8_MARGIN = 0.03
FLUSH_BYTES = 256 << 20  # written before each timed call: more than any GPU's L2 cache
OP_NAME = "quantkit_linear"
log = logging.getLogger("vllm.quantkit_kernels")  # under vLLM's logger: its handler prints INFO

_LAYERS: list[tuple[Any, Any]] = []  # (kernel, layer) by the index the custom op is given
_SWITCH: dict[tuple[int, int, int], int] = {}  # (K, N, group) -> largest token count for Marlin
_PLANS: dict[tuple[int, int], dict[int, str | None]] = {}  # W4A8 (K, N) -> schedule per count


def register() -> None:
    """vLLM's general-plugin hook: the kernel `QUANTKIT_VLLM_KERNEL` names, first in vLLM's list
    of mixed-precision kernels; nothing for any other value."""
    which = os.environ.get(ENV)
    if which not in KERNELS:
        return
    import torch
    from vllm.model_executor.kernels.linear import _POSSIBLE_KERNELS, register_linear_kernel
    from vllm.platforms import PlatformEnum
    from vllm.utils.torch_utils import direct_register_custom_op

    kernel = _kernel_class() if which == "dual" else _w4a8_class()
    for fn in (_linear, _linear_fake):  # the op's schema is read from real types
        fn.__annotations__ = {"x": torch.Tensor, "index": int, "return": torch.Tensor}
    direct_register_custom_op(OP_NAME, _linear, fake_impl=_linear_fake)
    register_linear_kernel(kernel, PlatformEnum.CUDA)
    kernels = _POSSIBLE_KERNELS[PlatformEnum.CUDA]
    kernels.insert(0, kernels.pop(kernels.index(kernel)))


def _linear(x: Any, index: int) -> Any:
    kernel, layer = _LAYERS[index]
    return kernel.run(layer, x)


def _linear_fake(x: Any, index: int) -> Any:
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


def choose_schedules(times: dict[int, dict[str | None, float]], margin: float = W4A8_MARGIN
                     ) -> dict[int, str | None]:
    """Per token count timed, the W4A8 schedule to run: the fastest, unless vLLM's own choice
    (None) is within `margin` of it."""
    plan: dict[int, str | None] = {}
    for m, by in times.items():
        best = min(by, key=lambda s: by[s])
        plan[m] = None if None in by and by[None] <= by[best] * (1 + margin) else best
    return plan


def schedule_for(plan: dict[int, str | None], tokens: int) -> str | None:
    """The schedule of the smallest token count timed that is at least `tokens`; vLLM's own
    choice beyond the largest (any schedule computes the same product: this is speed only)."""
    return next((plan[m] for m in sorted(plan) if tokens <= m), None)


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
            """Milliseconds per call of one kernel at `m` tokens (`_call_ms`)."""
            device = layer.__dict__["_quantkit_machete"].__dict__[self.w_q_name].device
            x = torch.randn(m, k, dtype=self.config.act_type, device=device)
            saved, self.switch = self.switch, (m if marlin else 0)
            try:
                return _call_ms(lambda: self.run(layer, x), device, reps)
            finally:
                self.switch = saved

    return QuantkitDualLinearKernel


def _w4a8_class() -> type:
    import torch
    from vllm import _custom_ops as ops
    from vllm.model_executor.kernels.linear import CutlassW4A8LinearKernel

    class QuantkitW4A8TilesLinearKernel(CutlassW4A8LinearKernel):  # vLLM logs this name
        """vLLM's CUTLASS W4A8 kernel (its checks, its weight layout), its tile schedule per step
        chosen from `_PLANS` instead of by the kernel's heuristic."""

        def __init__(self, c: Any, *names: Any, **kw: Any) -> None:
            super().__init__(c, *names, **kw)
            self.index = -1
            self.plan: dict[int, str | None] = {}

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            super().process_weights_after_loading(layer)
            self.plan = self._plan(layer)
            self.index = len(_LAYERS)
            _LAYERS.append((self, layer))

        def run(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            """The product with the schedule planned for this step's token count."""
            return self.mm(layer, x, schedule_for(self.plan, x.numel() // x.shape[-1]))

        def mm(self, layer: torch.nn.Module, x: torch.Tensor, schedule: str | None
               ) -> torch.Tensor:
            """The product with `schedule` (None: the kernel's heuristic)."""
            w_q, w_s, _, _ = self._get_weight_params(layer)
            x_2d = x.reshape(-1, x.shape[-1])
            # vLLM's CUDA kernel for it: inside this op nothing is compiled, and the op's native
            # path (what vLLM runs when torch.compile fuses it) would be several eager kernels
            q, act_scales = self.quant_fp8.forward_cuda(x_2d)
            out = ops.cutlass_w4a8_mm(a=q, b_q=w_q, b_group_scales=w_s,
                                      b_group_size=self.config.group_size,
                                      a_token_scales=act_scales,
                                      b_channel_scales=layer.weight_chan_scale,
                                      maybe_schedule=schedule)
            bias = getattr(layer, "bias", None)
            if bias is not None:
                out.add_(bias)
            return out.reshape(*x.shape[:-1], self.config.partition_weight_shape[1])

        def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
            return getattr(torch.ops.vllm, OP_NAME)(x, self.index)  # bias: run() adds its own

        def _plan(self, layer: torch.nn.Module) -> dict[int, str | None]:
            k, n = self.config.partition_weight_shape
            if (k, n) not in _PLANS:
                device: Any = layer.weight_chan_scale.device
                times: dict[int, dict[str | None, float]] = {}
                for m in W4A8_GRID:
                    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
                    times[m] = {}
                    for schedule in (None, *W4A8_SCHEDULES):
                        try:
                            times[m][schedule] = _call_ms(
                                lambda s=schedule, x=x: self.mm(layer, x, s),
                                device)
                        except RuntimeError as exc:  # a schedule this build was not made with
                            if "schedule" not in str(exc).lower():
                                raise
                _PLANS[(k, n)] = choose_schedules(times)
                torch.cuda.empty_cache()  # the timing's graphs and buffers: not the KV cache's
                log.info("quantkit w4a8 tiles: K=%d N=%d: %s (ms, vLLM's own / chosen: %s)", k,
                         n, _PLANS[(k, n)], " ".join(
                             f"{m}:{t[None]:.4f}/{t[_PLANS[(k, n)][m]]:.4f}"
                             for m, t in times.items()))
            return _PLANS[(k, n)]

    return QuantkitW4A8TilesLinearKernel


def _call_ms(call: Any, device: Any, reps: int = 20) -> float:
    """Milliseconds per call as the server runs it: replayed from a CUDA graph (no launch cost),
    with L2 flushed before each call (a layer's weights come from HBM in a step: the other
    layers' have evicted them)."""
    import torch

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    with_call = _graph_ms(lambda: (flush.zero_(), call()), reps)
    flush_only = _graph_ms(lambda: flush.zero_(), reps)
    return max(with_call - flush_only, 0.0) / reps


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
