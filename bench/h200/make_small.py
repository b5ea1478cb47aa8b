"""Device: a random-weight llama whose shapes vLLM's W4A16 kernels take (default hidden 1024,
MLP 2816, 4 layers, 4 KV heads, vocabulary 4096; head_dim 128) with a trained BPE tokenizer and
a chat template, in bf16, trained for 4096 positions. Llama-3.1-8B's shape and context:
`make_small.py OUT 4096 14336 32 8 128256 131072`. Built by tests/_models.py (code_tokenizer;
seed 0, every weight N(0, 0.02^2)).
usage: python3 bench/h200/make_small.py OUT [HIDDEN MLP LAYERS KV_HEADS VOCAB [POSITIONS]]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _models import code_tokenizer, random_llama  # noqa: E402

out = Path(sys.argv[1])
H, MLP, LAYERS, KV, VOCAB = (int(x) for x in (sys.argv[2:7] or ["1024", "2816", "4", "4", "4096"]))
POSITIONS = int(sys.argv[7]) if len(sys.argv) > 7 else 4096
tok = code_tokenizer(out)
model = random_llama(
    out, vocab_size=VOCAB, hidden_size=H, intermediate_size=MLP, num_hidden_layers=LAYERS,
    num_attention_heads=H // 128, num_key_value_heads=KV, head_dim=128,
    max_position_embeddings=POSITIONS, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    tie_word_embeddings=False, device="cuda" if torch.cuda.is_available() else "cpu",
    build_dtype=torch.bfloat16, std=0.02, max_shard_size="5GB")
print("made", out, sum(p.numel() for p in model.parameters()), "parameters")
