"""Device: a random-weight model with a real model's config and tokenizer (a folder holding
config.json and the tokenizer files, no weights), saved in bf16 (tests/_models.py's random_like,
seed 0): a checkpoint whose prompts tokenize as the real model's do, for comparing engines where
the weights cannot travel.
usage: python3 bench/h200/random_like.py CONFIG_DIR OUT"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _models import random_like  # noqa: E402

src, out = Path(sys.argv[1]), Path(sys.argv[2])
model = random_like(src, out)
print("made", out, sum(p.numel() for p in model.parameters()), "parameters")
