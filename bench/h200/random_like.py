"""Device: a random-weight model with a real model's config and tokenizer (a folder holding
config.json and the tokenizer files, no weights), saved in bf16: a checkpoint whose prompts
tokenize as the real model's do, for comparing engines where the weights cannot travel.
usage: python3 bench/h200/random_like.py CONFIG_DIR OUT"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
model.save_pretrained(out)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
print("made", out, sum(p.numel() for p in model.parameters()), "parameters")
