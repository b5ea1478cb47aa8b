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

FAMILIES: dict[str, Family] = {
    "llama": LLAMA_LIKE, "mistral": LLAMA_LIKE, "qwen2": LLAMA_LIKE, "qwen3": LLAMA_LIKE,
}


def family_for(model_type: str | None) -> Family:
    """The family of a config's model_type, or a BadInput naming the supported ones."""
    family = FAMILIES.get(model_type or "")
    if family is None:
        raise BadInput(f"architecture {model_type!r} has no GPTQ/AWQ layer mapping",
                       "supported: " + ", ".join(sorted(FAMILIES)) + "; or use --method gguf")
    return family
