"""An 8B-shaped (Llama-3-8B layers) random-weight llama with a real tokenizer, for timing runs
(built by tests/_models.py: seed 0, on the GPU, every weight N(0, 0.02^2), bf16).
usage: python3 bench/h200/make_model.py TOKENIZER_DIR OUT"""
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _models import random_model  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

tok, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = LlamaConfig(vocab_size=49152, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                  rope_theta=500000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
model = random_model(cfg, device="cuda", dtype=torch.bfloat16, std=0.02)
model.save_pretrained(out, max_shard_size="20GB")
for f in tok.iterdir():
    shutil.copy(f, out / f.name)
print("parameters", sum(p.numel() for p in model.parameters()))
