"""Tiny and random-weight models for the tests and the benchmarks, all built here: the tests'
byte-level BPE tokenizer, the tiny llama, a model of any config or shape with random weights from
a fixed seed (built twice, it is byte-identical, so cached and measured figures stay valid),
random weights under a real model's config, the architecture tests' shared helpers, and whether
this CPU multiplies bf16 in hardware (what a 16-bit model is computed in here).
Bench scripts put tests/ on sys.path and import it: `from _models import ...`."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def native_bf16_cpu() -> bool:
    """Whether /proc/cpuinfo names AMX or AVX512-BF16: a 16-bit model then runs in bf16 on this
    CPU (quantkit.threads.cpu_dtype), read here without asking torch."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = {f for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return bool({"amx_tile", "avx512_bf16"} & flags)


def _stdlib_text(files: int) -> list[str]:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(errors="replace") for p in sorted(root.glob("*.py"))[:files]]


def bpe_tokenizer(path: Path, *, vocab_size: int, files: int, unk: bool = True,
                  pad: bool = False) -> Any:
    """A byte-level BPE of `vocab_size` tokens trained on the first `files` stdlib modules, with
    <s>, </s>, <unk> and <pad> where asked, and a chat template; saved to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>" if unk else None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<unk>"] * unk + ["<s>", "</s>"] + ["<pad>"] * pad + ["<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(_stdlib_text(files), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    named = {"unk_token": "<unk>"} if unk else {}
    named |= {"pad_token": "<pad>"} if pad else {}
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", **named)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return tok


def tiny_tokenizer(path: Path) -> Any:
    """The tests' tokenizer, saved to `path`: 1k tokens trained on 40 stdlib modules (the tiny
    models', and the bench scripts' that need a small real tokenizer)."""
    return bpe_tokenizer(path, vocab_size=1024, files=40)


def code_tokenizer(path: Path) -> Any:
    """bench/h200/make_small.py's tokenizer, saved to `path`: 4k tokens trained on 200 stdlib
    modules, with <pad> and without <unk>."""
    return bpe_tokenizer(path, vocab_size=4000, files=200, unk=False, pad=True)


Spread = Callable[[torch.Tensor], "float | None"]


def random_model(config: Any, *, seed: int = 0, device: Any = "cpu",
                 build_dtype: torch.dtype = torch.float32, dtype: torch.dtype | None = None,
                 std: float | Spread | None = None) -> Any:
    """transformers' own model for `config`, initialised by it from torch seed `seed` on `device`
    in `build_dtype`, cast to `dtype`; then, where `std` is given (a number, or a function of the
    parameter that may answer None: leave it), each parameter redrawn from N(0, std^2)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # a copy: from_config writes the dtype into the config it gets
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=build_dtype)
    if dtype is not None:
        model = model.to(dtype)
    if std is not None:
        with torch.no_grad():
            for p in model.parameters():
                s = std(p) if callable(std) else std
                if s is not None:
                    p.normal_(0, s)
    return model


def save_random(config: Any, out: Path, tokenizer_from: Path | None = None, *,
                max_shard_size: str | None = None, **how: Any) -> Any:
    """random_model(config, **how) saved to `out`, with the tokenizer of `tokenizer_from`;
    returns the model."""
    from transformers import AutoTokenizer

    model = random_model(config, **how)
    model.save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if tokenizer_from is not None:
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    return model


def random_llama(out: Path, tokenizer_from: Path | None = None, *, seed: int = 0,
                 device: Any = "cpu", build_dtype: torch.dtype = torch.float32,
                 dtype: torch.dtype | None = None, std: float | None = None,
                 max_shard_size: str | None = None, **shape: Any) -> Any:
    """A llama of `shape` (LlamaConfig's fields) with random weights as random_model makes them,
    saved to `out` with the tokenizer of `tokenizer_from`; returns the model."""
    from transformers import LlamaConfig

    return save_random(LlamaConfig(**shape), out, tokenizer_from, max_shard_size=max_shard_size,
                       seed=seed, device=device, build_dtype=build_dtype, dtype=dtype, std=std)


def tiny_llama(path: Path) -> Path:
    """The tests' tiny llama in `path`: 2 layers, hidden 64, tiny_tokenizer's 1k tokens and chat
    template, transformers' initialisation from seed 0, float32."""
    tok = tiny_tokenizer(path)
    random_llama(path, vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    return path


def random_like(src: Path, out: Path) -> Any:
    """Random weights (seed 0, bf16) under the config of `src`, a folder of config.json and the
    tokenizer files without weights; saved to `out` with every other file of `src`."""
    from transformers import AutoConfig

    model = random_model(AutoConfig.from_pretrained(src), build_dtype=torch.bfloat16)
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, out / f.name)
    return model


COMMON = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              tie_word_embeddings=False)
DENSE = ["llama", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "granite", "olmo2"]
MOE = {"mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
       "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                     "shared_expert_intermediate_size": 128},
       "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
       "olmoe": {"num_experts": 4, "num_experts_per_tok": 2}}
TIED = {"gemma2", "gemma3_text"}  # Gemma ties its output head to the embeddings (vLLM requires it)


def _far_from_uniform(p: torch.Tensor) -> float | None:
    """Weights large enough that the outputs are far from uniform: linears and routers N(0, 0.08^2),
    fused experts N(0, 0.2^2) so that each matters; norms and biases as initialised."""
    return None if p.ndim < 2 else 0.08 if p.ndim == 2 else 0.2


def build(kind: str, tokenizer_from: Path, out: Path, **extra: object) -> Path:
    """A tiny random-weight model of `kind` (COMMON's shape, with `extra`) with the tokenizer of
    `tokenizer_from`, on disk."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(kind, **{**COMMON, **extra})
    save_random(cfg, out, tokenizer_from, std=_far_from_uniform)
    return out


def kl(path_a: Path, path_b: Path, samples: list[list[int]]) -> float:
    """Mean per-token KL(a || b) over the samples, through transformers' own forward."""
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(path_a, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(path_b, dtype=torch.float32).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s])
            la, lb = a(ids).logits.log_softmax(-1), b(ids).logits.log_softmax(-1)
            total += float((la.exp() * (la - lb)).sum())
            n += len(s)
    return total / n


def quantize_both(kind: str, path: Path, calib: Path, tmp_path_factory: Any) -> dict[str, Path]:
    """The model's GPTQ and AWQ (W4 g32) artifacts, made once for a module's tests."""
    from quantkit.config import QuantizeConfig
    from quantkit.quantize import quantize

    out = {}
    for method in ("gptq", "awq"):
        out[method] = tmp_path_factory.mktemp(f"{kind}-{method}") / "artifact"
        manifest = quantize(model=str(path), calib=calib, out=out[method],
                            cfg=QuantizeConfig(method=method, group_size=32))
        assert set(manifest.layer_errors) == {"0", "1"}
    return out
