"""Device: a random-weight mixture-of-experts model of the Qwen3-30B-A3B shape (hidden 2048,
32 query / 4 KV heads of 128, 128 experts of width 768, 8 routed per token, vocabulary 151936)
with N decoder layers, in bf16 (tests/_models.py: seed 0, every weight N(0, 0.02^2)), and the
tests' BPE tokenizer with a chat template; with --config only config.json and the tokenizer (for
vLLM's --load-format dummy, all 48 layers).
usage: python3 bench/h200/make_moe.py OUT LAYERS [--config]"""
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3MoeConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _models import save_random, tiny_tokenizer  # noqa: E402

out, layers = Path(sys.argv[1]), int(sys.argv[2])
tok_dir = out.parent / "tok"
if not tok_dir.is_dir():
    tiny_tokenizer(tok_dir)
tok = AutoTokenizer.from_pretrained(tok_dir)
cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=768, num_hidden_layers=layers, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     norm_topk_prob=True, max_position_embeddings=40960, rope_theta=1e6,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])
cfg.architectures = ["Qwen3MoeForCausalLM"]
if "--config" in sys.argv:
    out.mkdir(parents=True, exist_ok=True)
    cfg.torch_dtype = "bfloat16"
    cfg.save_pretrained(out)
else:
    model = save_random(cfg, out, device="cuda" if torch.cuda.is_available() else "cpu",
                        build_dtype=torch.bfloat16, std=0.02, max_shard_size="5GB")
    print("made", out, sum(p.numel() for p in model.parameters()), "parameters")
tok.save_pretrained(out)
