"""The quantization methods, in one registry. Every list that names methods is read from here: the
CLI's `--method` help, the recipe's checks, `quantkit auto`'s ladders and candidate grammar, and
`quantize()`'s dispatch.

A method is one module with one `register_method` line: either a layer quantizer run by the
layer-by-layer engine into a compressed-tensors checkpoint (`layer`), or a whole pipeline of its
own (`quantize`). Options of its own are a frozen dataclass it names (`options`), whose fields join
`quantkit quantize`'s flags and the recipe's `quantize:` section. The built-in methods are the
modules of the package quantkit.methods (which hands this registry's names on to plugins); the
registry names them, as it names every method's code, and imports them as it is made. Pure:
imports no torch.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

from quantkit.errors import BadInput
from quantkit.registry import Registry

LAYERWISE = "quantkit.quantize.layerwise:quantize_layerwise"


# What a method's own code does, by trait name (Method.supports). What the layer-by-layer engine
# gives every layerwise method is no trait: streaming the layers from the shards, --activations
# disk, --kv-cache fp8 (calibrated from each quantized layer's forward).
TRAITS = {
    "act_order": "--act-order: its quantizer takes columns by decreasing Hessian diagonal "
                 "(spec.act_order), on by default",
    "hessians": "--hessians original: its layer quantizer takes each step's Hessian from one "
                "pass of the original model (`hessians=`, by the step's first linear)",
    "awq_scales": "--awq-scales: it folds AWQ's activation-aware scales into a layer first",
    "w4a8": "--activations fp8 with 4-bit integer weights (W4A8): its quantizer rounds group "
            "scales onto the grid vLLM's W4A8 kernel keeps exactly (spec.snap)",
    "w8_groups": "--w8-groups: it quantizes each linear group at its own bits (spec.for_group)",
    "static": "--static: one FP8 scale per linear input, from the calibration set (FP8-static)",
    "moe": "mixture-of-experts models, by a method with a pipeline of its own (a layerwise "
           "method says so by naming its `experts` quantizer)",
}


class CandidateFields(TypedDict, total=False):
    """The QuantizeConfig fields a candidate's name sets (`Method.parse`)."""

    method: str
    bits: int
    group_size: int
    w8_groups: str
    activations: str
    static: bool
    quant_type: str
    hessians: str


class CandidateParser(Protocol):
    """A method's candidate grammar (`Method.candidate`): (method, candidate name) -> fields."""

    def __call__(self, method: str, name: str, /) -> CandidateFields: ...


@dataclass(frozen=True)
class Method:
    """One quantization method.

    `quantize` names "module:function" (or is the function) with quantize()'s keyword arguments
    (model, cfg, calib, out, resume, force) returning the artifact's Manifest (a
    `quantkit.quantize.QuantizePipeline`); `layer` names the layer quantizer the layer-by-layer
    engine calls for each decoder layer (layerwise methods; a
    `quantkit.quantize.layers.LayerQuantizer`);
    `checkpoint` is what it writes (compressed-tensors or gguf); `ladder` is `quantkit auto`'s
    default candidates, smallest first, ending with one every model can take; `larger`, the
    candidates "none passed" may suggest beyond it (those the model's shapes allow); `candidate` turns
    a candidate's name into the QuantizeConfig fields it sets.

    Its traits, which every check asks instead of its name:
    - `experts`: "module:function" (or the function) quantizing one expert of a mixture-of-
      experts layer, (act, gate_up, down, e, x, spec) -> (gate/up's, down's LinearResult), a
      `quantkit.quantize.layers.ExpertQuantizer`; None:
      the method cannot quantize a mixture of experts (refused before any work, never handed to
      another method's expert quantizer);
    - `float_weights`: its weights are floating point (FP8 E4M3), written float-quantized rather
      than pack-quantized, always symmetric;
    - `fixed_bits`, `fixed_group`, `fixed_activations`: what it always quantizes to, whatever
      --bits, --group-size and --activations say (FP8: 8 bits, per channel, FP8 activations);
    - `supports`: the options its own code honours, from TRAITS; an option it does not support
      is refused (exit 2) before any work.

    `options` names ("module:attribute", or is) a frozen dataclass of its own settings, fields
    made with `quantkit.option.opt`: they join QuantizeConfig (one flag and one `quantize:`
    recipe key each; methods of one family may name the same dataclass), the method reads them as
    `cfg.options()` (a layer quantizer as `spec.options`), the manifest records them, its
    `check(cfg)` is asked by every QuantizeConfig check and its `preflight()`, where it has one,
    by `quantkit run` before the first step; the layer-by-layer engine asks them for act-order
    and the original model's Hessians where they have it (`HessianOptions`). `instead` is what a
    report whose gate failed suggests trying (a string, or a function of the artifact's
    parameters).

    The functions it names take the quantizer's and the config's types, which stand above this
    registry: their Protocols are the callers' (`quantkit.quantize`'s, `quantize.layers`'), and
    each built-in method module holds its functions against them (`_layer: LayerQuantizer =
    gptq_layer` under TYPE_CHECKING), so mypy checks each; a plugin's may be "module:function".
    """

    name: str
    help: str
    quantize: str | Callable[..., Any] = LAYERWISE
    layer: str | Callable[..., Any] | None = None
    checkpoint: str = "compressed-tensors"
    ladder: tuple[str, ...] = ()
    larger: tuple[str, ...] = ()  # what "none passed" may offer beyond the ladder, smallest first
    candidate: CandidateParser | None = None
    experts: str | Callable[..., Any] | None = None
    float_weights: bool = False
    fixed_bits: int | None = None
    fixed_group: int | None = None
    fixed_activations: str | None = None  # "fp8": its activations are always FP8
    supports: frozenset[str] = frozenset()
    options: str | type | None = None
    instead: str | Callable[[Mapping[str, Any]], str] = "GPTQ or AWQ"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.supports) - set(TRAITS))
        if unknown:
            raise ValueError(f"method {self.name}: unknown trait {unknown[0]!r} (known: "
                             + ", ".join(TRAITS) + ")")

    def parse(self, name: str) -> CandidateFields:
        """The QuantizeConfig fields candidate `name` sets (BadInput when it names none); a
        candidate may name another method (FP8 among GPTQ's)."""
        parse = self.candidate or weight_candidate
        fields: CandidateFields = {"method": self.name}
        fields.update(parse(self.name, name))
        return fields

    @property
    def layerwise(self) -> bool:
        """Run by the layer-by-layer engine (streaming, --activations disk, --kv-cache fp8)."""
        return self.layer is not None

    @property
    def moe(self) -> bool:
        """Whether it quantizes mixture-of-experts models."""
        return self.experts is not None if self.layerwise else "moe" in self.supports


METHODS: Registry[Method] = Registry("method", "--method", "quantkit.methods")


def register_method(method: Method) -> Method:
    """Add a method; from then on the CLI, recipes, quantize() and auto know it."""
    return METHODS.register(method.name, method)


def quantizers(name: str, experts: bool) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """Layerwise method `name`'s layer quantizer (a `LayerQuantizer`) and, for a model whose
    layers hold experts (`experts`), its expert quantizer (an `ExpertQuantizer`), imported now;
    BadInput (before any work) when it has either missing: a model's experts would otherwise be
    left to no one."""
    from quantkit.registry import load

    method = METHODS[name]
    if method.layer is None:
        raise BadInput(f"method {name} has no layer quantizer", "use a layerwise method: "
                       + ", ".join(n for n in METHODS if METHODS[n].layer is not None))
    if experts and method.experts is None:
        raise BadInput(f"--method {name} has no expert quantizer: it is built for dense models, "
                       "and this model's layers hold a mixture of experts",
                       either("--method", [n for n in METHODS if METHODS[n].moe]))
    return load(method.layer), load(method.experts) if experts else None


def layer_quantizer(name: str) -> Callable[..., Any]:
    """The layer quantizer of layerwise method `name` (a `LayerQuantizer`), imported now."""
    return quantizers(name, experts=False)[0]


def either(flag: str, names: list[str]) -> str:
    """A hint offering `names`: "use --method gptq, --method awq or --method gguf"."""
    options = [f"{flag} {n}" for n in names]
    return "use " + (", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1
                     else options[0] if options else f"another {flag}")


def with_trait(trait: str) -> list[str]:
    """The methods that have `trait` (TRAITS, or "layerwise"), in registration order."""
    return [n for n in METHODS if trait in METHODS[n].supports
            or (trait == "layerwise" and METHODS[n].layerwise)]


def supporting(trait: str) -> str:
    """The methods with `trait`, as messages name them: "GPTQ/AWQ"."""
    return "/".join(n.upper() for n in with_trait(trait)) or "no method"


def instead(name: str, parameters: Mapping[str, Any]) -> str:
    """What to try instead of method `name`, whose artifact (of these parameters) failed its gate."""
    method = METHODS.get(name)
    said = method.instead if method is not None else Method.instead
    return said(parameters) if callable(said) else said


class QuantizeSettings(Protocol):
    """What a method's options read of the settings they join (`QuantizeConfig` has it): the
    method, its registry entry and the shared options that rule some of a method's out."""

    @property
    def method(self) -> str: ...

    @property
    def kv_cache(self) -> str: ...

    @property
    def traits(self) -> Method: ...

    @property
    def activation_store(self) -> str: ...


@runtime_checkable
class HessianOptions(Protocol):
    """What the layer-by-layer engine asks of a method's own options (`QuantizeConfig`'s
    `uses_act_order` and `original_hessians`), where they have it (GPTQ's): whether its
    quantizer takes columns by decreasing Hessian diagonal (the checkpoint says so), and whether
    each layer's Hessians come from one pass of the original model. A method whose options lack
    it does neither."""

    def uses_act_order(self, cfg: QuantizeSettings) -> bool: ...

    @property
    def original_hessians(self) -> bool: ...


# The integer-weight methods' (GPTQ's, AWQ's) candidates: 8-bit per channel ends the ladder,
# every model's layers take it
WEIGHT_LADDER = ("W4g128", "W4g64", "W4g32", "W4g32+10%", "W8")
WEIGHT_LARGER = ("W8", "W8g128", "W8g64", "W8g32")


def weight_candidate(method: str, name: str) -> CandidateFields:
    """W4g128 / W8 (per channel) / W4g32+10% (the 10% most sensitive linear groups at 8 bits) /
    W4A8g128 (FP8 activations); FP8 and FP8-static name the fp8 method's candidates."""
    if name.strip().upper().startswith("FP8"):
        return METHODS["fp8"].parse(name)
    m = re.fullmatch(r"[Ww](4|8)(?:[Aa](8|16))?(?:[Gg](\d+))?(?:\+(\d+%?))?", name.strip())
    if not m or (m.group(4) and m.group(1) != "4") or (m.group(2) == "8" and (
            m.group(1) != "4" or m.group(4))):
        raise BadInput(f"unknown {method} candidate {name!r}",
                       "name candidates W4g128, W4g64, W8g128, W8 (per channel), W4g32+10% "
                       "(the 10% most sensitive linear groups at 8 bits), W4A8g128 (FP8 "
                       "activations), FP8 or FP8-static")
    fields: CandidateFields = {"bits": int(m.group(1)),
                               "group_size": int(m.group(3)) if m.group(3) else -1,
                               "w8_groups": m.group(4) or ""}
    if m.group(2) == "8":
        fields["activations"] = "fp8"
    return fields


# The built-in methods, one module each, which registers itself with one `register_method` line:
# named, as every method's code is (they import this registry and quantkit.quantize's numerics),
# and imported now, in this order (the CLI's, the catalog's), so that the registry is complete
# whenever it is asked
BUILT_IN = ("quantkit.methods.gptq", "quantkit.methods.awq", "quantkit.methods.fp8",
            "quantkit.methods.gguf")
for _module in BUILT_IN:
    importlib.import_module(_module)
