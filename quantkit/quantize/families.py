"""Which linears of a decoder layer are quantized, in what order, and where AWQ folds its scales:
the `Family` record. `quantkit.quantize.structure` reads it from the model; `LLAMA_LIKE` is what
that reading gives for llama-like models, written out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantkit.artifact import AwqFold, ExpertsStructure, Structure


@dataclass(frozen=True)
class AWQMapping:
    """AWQ scales the inputs of `linears` and folds the inverse into `prev` (a norm or a linear;
    None: nothing before them absorbs scales exactly, so AWQ only clips them). A norm that
    multiplies by `offset + weight` (Gemma's 1 + weight) has that offset."""

    prev: str | None
    linears: tuple[str, ...]
    offset: float = 0.0

    def describe(self) -> AwqFold:
        fold: AwqFold = {"into": self.prev, "linears": list(self.linears)}
        if self.offset:
            fold["offset"] = self.offset
        return fold


@dataclass(frozen=True)
class ExpertMatrix:
    """One expert's matrix as the checkpoint stores it: rows `start:stop` of `param[e]` (a fused
    3-D parameter of the experts module), saved as `saved.format(e=e)` within the layer."""

    param: str  # "gate_up_proj"
    start: int
    stop: int
    saved: str  # "block_sparse_moe.experts.{e}.w1"


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts block: the experts module holding fused `gate_up` (E x 2I x H, gate
    rows first) and `down` (E x H x I) parameters, computing down(act(gate) * up) per expert;
    the routers kept in 16 bits; and the per-expert names the checkpoint stores."""

    module: str  # "mlp.experts"
    count: int
    top_k: int
    gate_up: str
    down: str
    matrices: tuple[ExpertMatrix, ...]
    routers: tuple[str, ...]  # modules kept in 16 bits: "mlp.gate", "mlp.shared_expert_gate"
    renames: tuple[tuple[str, str], ...] = ()  # layer keys the checkpoint names otherwise

    def saved_key(self, key: str) -> str:
        """The checkpoint's name for layer key `key` ("mlp.gate.weight")."""
        return dict(self.renames).get(key, key)

    @property
    def fused_keys(self) -> tuple[str, str]:
        """The layer's state-dict keys of the fused gate/up and down parameters."""
        return f"{self.module}.{self.gate_up}", f"{self.module}.{self.down}"

    def describe(self) -> ExpertsStructure:
        return {"module": self.module, "experts": self.count, "top_k": self.top_k,
                "matrices": [m.saved for m in self.matrices], "routers": list(self.routers)}


@dataclass(frozen=True)
class Family:
    """Decoder-layer structure shared by a set of architectures."""

    layers_attr: str  # where the decoder layers live on the *ForCausalLM model
    # GPTQ's true-sequential steps: each step's linears read the same input, so they share one
    # Hessian and are quantized as one stacked matrix.
    sequential: tuple[tuple[str, ...], ...]
    awq: tuple[AWQMapping, ...]
    experts: Experts | None = None  # a mixture-of-experts block, quantized after the groups

    @property
    def linears(self) -> tuple[str, ...]:
        return tuple(name for step in self.sequential for name in step)

    def saved_key(self, key: str) -> str:
        """The checkpoint's name for layer key `key` (a mixture-of-experts layer may rename it)."""
        return self.experts.saved_key(key) if self.experts else key

    def saved_linear(self, name: str) -> str:
        """The checkpoint's name of linear `name`."""
        return self.saved_key(f"{name}.weight").removesuffix(".weight")

    @property
    def quantized(self) -> tuple[str, ...]:
        """Every quantized matrix as the checkpoint names it, numbers as N (model_info's
        shapes): the linears, then each expert matrix."""
        experts = self.experts.matrices if self.experts else ()
        return self.linears + tuple(m.saved.format(e="N") for m in experts)

    def describe(self) -> Structure:
        """JSON for the manifest: where the layers are, the groups in order, AWQ's folds."""
        out: Structure = {
            "layers": self.layers_attr, "groups": [list(step) for step in self.sequential],
            "awq_folds": [m.describe() for m in self.awq]}
        if self.experts:
            out["experts"] = self.experts.describe()
        return out

    def group_keys(self, n_layers: int) -> list[tuple[str, int, tuple[str, ...]]]:
        """Every linear group of the model as (key, layer, linears): the linears one GPTQ step
        stacks, which vLLM fuses into one module, so they must share one scheme. Keys read
        `3:q/k/v`, `3:o`, `3:gate/up`, `3:down`."""
        return [(f"{i}:{group_label(step)}", i, step) for i in range(n_layers)
                for step in self.sequential]


def group_label(step: tuple[str, ...]) -> str:
    return "/".join(n.rsplit(".", 1)[-1].removesuffix("_proj") for n in step)


# the modules vLLM fuses a group's linears into (its packed_modules_mapping for llama-likes)
VLLM_FUSED = {("q_proj", "k_proj", "v_proj"): "qkv_proj", ("gate_proj", "up_proj"): "gate_up_proj"}


def group_target(layers_attr: str, i: int, step: tuple[str, ...]) -> str:
    """A compressed-tensors target matching the group's linears and the module vLLM fuses them
    into: a regex, which both libraries rank above the class name `Linear`."""
    import re

    parent = step[0].rsplit(".", 1)[0]
    leaves = tuple(n.rsplit(".", 1)[-1] for n in step)
    names = leaves + ((VLLM_FUSED[leaves],) if leaves in VLLM_FUSED else ())
    return (f"re:^{re.escape(f'{layers_attr}.{i}.{parent}.')}"
            f"({'|'.join(re.escape(x) for x in names)})$")


_Q, _K, _V, _O = (f"self_attn.{p}_proj" for p in "qkvo")
_GATE, _UP, _DOWN = "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"

LLAMA_LIKE = Family(
    layers_attr="model.layers",
    sequential=((_Q, _K, _V), (_O,), (_GATE, _UP), (_DOWN,)),
    awq=(AWQMapping("input_layernorm", (_Q, _K, _V)), AWQMapping(_V, (_O,)),
         AWQMapping("post_attention_layernorm", (_GATE, _UP)), AWQMapping(_UP, (_DOWN,))),
)
