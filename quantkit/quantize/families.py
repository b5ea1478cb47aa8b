"""Which linears of a decoder layer are quantized, in what order, and where AWQ folds its scales.

Declared as data per architecture family; an architecture without an entry gets a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.errors import BadInput


@dataclass(frozen=True)
class AWQMapping:
    """AWQ scales the inputs of `linears` and folds the inverse into `prev` (a norm or a linear)."""

    prev: str
    linears: tuple[str, ...]


@dataclass(frozen=True)
class Family:
    """Decoder-layer structure shared by a set of architectures."""

    layers_attr: str  # where the decoder layers live on the *ForCausalLM model
    # GPTQ's true-sequential steps: each step's linears read the same input, so they share one
    # Hessian and are quantized as one stacked matrix.
    sequential: tuple[tuple[str, ...], ...]
    awq: tuple[AWQMapping, ...]

    @property
    def linears(self) -> tuple[str, ...]:
        return tuple(name for step in self.sequential for name in step)


_Q, _K, _V, _O = (f"self_attn.{p}_proj" for p in "qkvo")
_GATE, _UP, _DOWN = "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"

LLAMA_LIKE = Family(
    layers_attr="model.layers",
    sequential=((_Q, _K, _V), (_O,), (_GATE, _UP), (_DOWN,)),
    awq=(AWQMapping("input_layernorm", (_Q, _K, _V)), AWQMapping(_V, (_O,)),
         AWQMapping("post_attention_layernorm", (_GATE, _UP)), AWQMapping(_UP, (_DOWN,))),
)

FAMILIES: dict[str, Family] = {
    "llama": LLAMA_LIKE, "mistral": LLAMA_LIKE, "qwen2": LLAMA_LIKE, "qwen3": LLAMA_LIKE,
}


def family_for(model_type: str) -> Family:
    """The family of a config's model_type, or a BadInput naming the supported ones."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise BadInput(f"architecture {model_type!r} has no GPTQ/AWQ layer mapping",
                       "supported: " + ", ".join(sorted(FAMILIES))
                       + "; or use --method gguf") from None
