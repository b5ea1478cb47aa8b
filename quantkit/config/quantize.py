"""`quantkit quantize`'s options: the recipe's `quantize:` section. The options several methods
share are declared here; each registered method's own (`Method.options`, e.g. GPTQ's --damp,
gguf's --quant-type) join them as fields of the same dataclass, flat in the section, so they stay
one flag and one recipe key each. The methods are the method registry's
(quantkit.method_registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.checkpoints import checkpoint
from quantkit.config.fields import opt
from quantkit.config.options import each, options_class, read, with_options
from quantkit.errors import BadInput
from quantkit.method_registry import METHODS, HessianOptions, Method, either, supporting, with_trait

ACTIVATION_STORES = ("auto", "memory", "disk")
ACTIVATION_FORMATS = ("fp8", "16bit")
W4A8_GROUP = 128  # the one group size of vLLM's CUTLASS W4A8 kernel


@with_options(METHODS, "quantize")
@dataclass(frozen=True)
class QuantizeConfig:
    """`quantkit quantize` and the recipe's `quantize:` section (each method's own options follow
    these fields: `options(name)` reads them)."""

    method: str = opt("gptq", " ".join(f"{m}: {METHODS[m].help}" for m in METHODS))
    bits: int = opt(4, "4 or 8.")
    group_size: int = opt(128, "Columns per scale; -1 per channel.")
    sym: bool = opt(True, "Symmetric or asymmetric grid.", flag="--sym/--asym")
    w8_groups: str = opt("", "GPTQ/AWQ at 4 bits: keep the N (or N%) linear groups whose "
                             "quantization alone adds the most KL to the model's output at 8 "
                             "bits (q/k/v, o, gate/up, down per layer; e.g. 8 or 10%).")
    expert_floor: int = opt(256, "GPTQ/AWQ of mixture-of-experts models: an expert the router "
                                 "sends fewer calibration tokens than this is calibrated on all "
                                 "of them (as llm-compressor's all-experts calibration), and the "
                                 "manifest says which.")
    sensitivity_tokens: int = opt(512, "Calibration tokens the per-group KL is measured on "
                                       "(--w8-groups).")
    stream: bool = opt(True, "GPTQ/AWQ: read each decoder layer from the model's shards when its "
                             "turn comes, so CPU memory holds about one layer and the "
                             "embeddings; --no-stream loads the whole model first (as "
                             "--hessians original and --w8-groups always do).",
                       flag="--stream/--no-stream")
    activations: str = opt("auto", "fp8: the served model's activations in FP8 (GPTQ/AWQ at 4 "
                                   "bits, group 128: W4A8, vLLM's CUTLASS W4A8 kernel on Hopper; "
                                   "--method fp8 always). And on a CPU, where the calibration "
                                   "activations wait between decoder layers: memory, disk "
                                   "(memory-mapped files beside the output, deleted as they are "
                                   "made, so the OS pages them) or auto (disk when they would not "
                                   "fit in free memory). Both: e.g. fp8,disk.")
    static: bool = opt(False, "fp8: one static FP8 scale per linear input, from the calibration "
                              "set's largest value (FP8-static), instead of a scale per token "
                              "computed as the model runs.")
    kv_cache: str = opt("auto", "fp8: calibrate one FP8 scale for the keys (after RoPE) and one "
                                "for the values of each layer's attention on the calibration "
                                "set, for vLLM's FP8 KV cache (`quantkit serve` then serves "
                                "with it, and validation emulates it); auto: none.")
    device: str = opt("auto", "auto, cpu or cuda.")
    batch_tokens: int | None = opt(None, "Tokens per forward batch (default 16384 on CUDA, "
                                         "4096 on CPU).")

    def check(self) -> None:
        """Option values that are wrong whatever the model."""
        m = self.traits  # an unknown method is BadInput with the closest name
        if self.bits not in (4, 8):
            raise BadInput(f"--bits {self.bits} is not supported", "use --bits 4 or --bits 8")
        if self.group_size != -1 and self.group_size <= 0:
            raise BadInput(f"--group-size {self.group_size} must be positive (or -1 per channel)",
                           "use 128, or 64 for hidden sizes 128 does not divide")
        self._check_activations()
        if self.activation_store == "disk" and not m.layerwise:
            raise BadInput(f"--activations disk applies to {supporting('layerwise')} layer by "
                           "layer (the activations of --hessians original are never held "
                           "between layers)", "leave --activations out")
        if self.kv_cache not in ("auto", "fp8"):
            raise BadInput(f"unknown --kv-cache {self.kv_cache!r}", "use --kv-cache fp8, or auto")
        if self.kv_cache == "fp8" and not m.layerwise:
            fmt = checkpoint(m.checkpoint)
            raise BadInput(f"--kv-cache fp8 does not apply to --method {self.method}"
                           + (f": a {fmt.label} server sets its cache type when it serves"
                              if not fmt.kv_scales else " (it does not run layer by layer)"),
                           either("--method", with_trait("layerwise"))
                           + " for a calibrated FP8 KV cache")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise BadInput(f"unknown --device {self.device}", "use auto, cpu or cuda")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise BadInput(f"--batch-tokens {self.batch_tokens} must be positive", "use e.g. 4096")
        if self.w8_groups:
            if "w8_groups" not in m.supports or self.weight_bits != 4:
                raise BadInput(f"--w8-groups applies to {supporting('w8_groups')} at --bits 4",
                               f"use --method {'|'.join(with_trait('w8_groups'))} --bits 4, or "
                               "leave --w8-groups out")
            self.upgrade_count(1)
        if self.expert_floor < 1:
            raise BadInput(f"--expert-floor {self.expert_floor} must be at least 1",
                           "use e.g. --expert-floor 256")
        if self.sensitivity_tokens < 16:
            raise BadInput(f"--sensitivity-tokens {self.sensitivity_tokens} is too few",
                           "use 256-2048")
        for opts in each(METHODS):  # every method's, used or not: a wrong value is wrong anyway
            own = read(opts, self)
            if hasattr(own, "check"):
                own.check(self)

    def options(self, name: str | None = None) -> Any:
        """Method `name`'s own options (default: this config's method's) as its dataclass, read
        from this config (None: it has none)."""
        opts = options_class(METHODS[name or self.method])
        return None if opts is None else read(opts, self)

    def preflight(self) -> None:
        """What the methods' own options name on disk (their `preflight`, where they have one),
        checked before `quantkit run`'s first step: every method's, as `quantkit auto` may
        switch methods."""
        for opts in each(METHODS):
            own = read(opts, self)
            if hasattr(own, "preflight"):
                own.preflight()

    def _activation_words(self) -> list[str]:
        words = [w.strip().lower() for w in self.activations.split(",") if w.strip()]
        bad = [w for w in words if w not in (*ACTIVATION_STORES, *ACTIVATION_FORMATS)]
        if bad or not words or len([w for w in words if w in ACTIVATION_STORES]) > 1 or len(
                [w for w in words if w in ACTIVATION_FORMATS]) > 1:
            raise BadInput(f"unknown --activations {self.activations!r}",
                           "use fp8 (W4A8 / FP8 activations) and/or auto, memory or disk, "
                           "e.g. --activations fp8,disk")
        return words

    @property
    def activation_store(self) -> str:
        """Where the calibration activations wait between layers: auto, memory or disk."""
        return next((w for w in self._activation_words() if w in ACTIVATION_STORES), "auto")

    @property
    def traits(self) -> Method:
        """The method's registry entry: what it fixes and supports."""
        return METHODS[self.method]

    @property
    def activation_format(self) -> str:
        """The served model's activations: "fp8" (dynamic per token, or --static per tensor) or
        "16bit"; a method with fixed activations (--method fp8) always quantizes them so."""
        return self.traits.fixed_activations or next(
            (w for w in self._activation_words() if w in ACTIVATION_FORMATS), "16bit")

    def _check_activations(self) -> None:
        """--activations fp8 and --static: what each method can take."""
        self._activation_words()
        m = self.traits
        if self.static and "static" not in m.supports:
            static = with_trait("static")
            raise BadInput(f"--static applies to {' or '.join(f'--method {n}' for n in static)} "
                           "(per-tensor FP8 activation scales)",
                           either("--method", static) + " --static, or leave --static out")
        if m.fixed_activations or self.activation_format != "fp8":
            return
        if "w4a8" not in m.supports:
            fixed = [n for n in METHODS if METHODS[n].fixed_activations == "fp8"]
            fmt = checkpoint(m.checkpoint)
            raise BadInput(f"--activations fp8 does not apply to --method {self.method}"
                           + (f" (a {fmt.label} quantizes weights only)" if fmt.weights_only
                              else ""), either("--method", with_trait("w4a8")) + " for W4A8"
                           + (", or " + " or ".join(f"--method {n}" for n in fixed)
                              if fixed else ""))
        if self.bits != 4 or self.group_size != W4A8_GROUP or not self.sym:
            raise BadInput(f"--activations fp8 (W4A8) needs --bits 4 --group-size {W4A8_GROUP} "
                           "--sym: vLLM's CUTLASS W4A8 kernel takes nothing else",
                           f"use --bits 4 --group-size {W4A8_GROUP} --sym, or --method fp8")
        if self.w8_groups:
            raise BadInput("--w8-groups keeps groups at 8-bit integer weights, which vLLM cannot "
                           "serve with FP8 activations", "leave --w8-groups out with "
                           "--activations fp8")

    def upgrade_count(self, groups: int) -> int:
        """How many of a model's `groups` linear groups --w8-groups keeps at 8 bits."""
        import re

        m = re.fullmatch(r"(\d+)(%?)", self.w8_groups.strip())
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(1)) > 100):
            raise BadInput(f"--w8-groups {self.w8_groups!r} is not a count or a percentage",
                           "use e.g. --w8-groups 8 or --w8-groups 10%")
        n = int(m.group(1))
        return min(groups, -(-n * groups // 100) if m.group(2) else n)

    @property
    def weight_bits(self) -> int:
        """Bits per weight: --bits, or what the method fixes (FP8: 8)."""
        return self.traits.fixed_bits or self.bits

    @property
    def weight_group_size(self) -> int:
        """Columns per weight scale: --group-size, or what the method fixes (FP8: -1, per
        channel)."""
        fixed = self.traits.fixed_group
        return self.group_size if fixed is None else fixed

    # what the layer-by-layer engine asks of the method's own options (`HessianOptions`): the
    # checkpoint's act-order, the original model's Hessian pass; a method without them has neither
    @property
    def uses_act_order(self) -> bool:
        """--act-order resolved by the method's own options (GPTQ's: on by default)."""
        own = self.options()
        return isinstance(own, HessianOptions) and own.uses_act_order(self)

    @property
    def original_hessians(self) -> bool:
        """--hessians original: every layer's Hessians from one pass of the original model."""
        own = self.options()
        return isinstance(own, HessianOptions) and own.original_hessians
