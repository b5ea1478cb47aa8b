"""Fixtures: a tiny random-weight llama with a real (trained) tokenizer, and the real demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _training_text() -> list[str]:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(errors="replace") for p in sorted(root.glob("*.py"))[:40]]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama (hidden 64) with a 1k-token BPE tokenizer and a chat template, on disk."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(_training_text(), trainers.BpeTrainer(
        vocab_size=1024, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The built-in demo model (SmolLM2-135M-Instruct), converted once into the cache."""
    from quantkit.models import resolve_model

    return resolve_model("smollm2-135m").path


@pytest.fixture
def cli():
    """Run the real CLI in-process; returns (exit_code, stdout, stderr)."""
    from quantkit.cli import app

    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        res = runner.invoke(app, list(args))
        if res.exception and not isinstance(res.exception, SystemExit):
            raise res.exception
        return res.exit_code, res.stdout, res.stderr

    return invoke


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real-looking offline sources: prose (.md), code (folder) and chats (.jsonl), from the stdlib."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    base = tmp_path_factory.mktemp("corpus")
    files = sorted(root.glob("*.py"))
    docs = []
    for f in files:
        try:
            tree = ast.parse(f.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
                docs.append((f.stem, node.name, ast.get_docstring(node)))
    prose = base / "prose.md"
    prose.write_text("\n\n".join(d for _, _, d in docs[: len(docs) // 2]))
    chats = base / "chats.jsonl"
    with chats.open("w") as fh:
        for mod, name, doc in docs[len(docs) // 2:]:
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": f"What does {name} in the {mod} module do?"},
                {"role": "assistant", "content": doc}]}) + "\n")
    code = base / "code"
    code.mkdir()
    for f in files[:120]:
        (code / f.name).write_text(f.read_text(errors="replace"))
    return {"prose": prose, "chats": chats, "code": code}


@pytest.fixture(scope="session")
def tiny_artifact(tiny_model: Path, corpus: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> Path:
    """A GPTQ W4 g32 compressed-tensors artifact of the tiny model."""
    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.quantize import quantize

    root = tmp_path_factory.mktemp("tiny-artifact")
    calibrate(model=str(tiny_model), out=root / "calib", cfg=CalibrateConfig(
        sources=(str(corpus["prose"]), str(corpus["code"])), samples=16, min_tokens=64,
        max_tokens=128))
    quantize(model=str(tiny_model), cfg=QuantizeConfig(method="gptq", group_size=32),
             calib=root / "calib", out=root / "artifact")
    return root / "artifact"
