"""Device: a random-weight llama whose shapes vLLM's W4A16 kernels take (default hidden 1024,
MLP 2816, 4 layers, 4 KV heads, vocabulary 4096; head_dim 128) with a trained BPE tokenizer and
a chat template, in bf16. The 8B shape: `make_small.py OUT 4096 14336 32 8 128256`.
usage: python3 bench/h200/make_small.py OUT [HIDDEN MLP LAYERS KV_HEADS VOCAB]"""
import glob
import sys
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
H, MLP, LAYERS, KV, VOCAB = (int(x) for x in (sys.argv[2:7] or ["1024", "2816", "4", "4", "4096"]))
text = [Path(f).read_text(errors="ignore")
        for f in sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:200]]
bpe = Tokenizer(models.BPE(unk_token=None))
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=4000, special_tokens=["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                              pad_token="<pad>")
tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                     "{% endif %}")
cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=MLP, num_hidden_layers=LAYERS,
                  num_attention_heads=H // 128, num_key_value_heads=KV, head_dim=128,
                  max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = LlamaForCausalLM(cfg)
for p in model.parameters():
    torch.nn.init.normal_(p.data, std=0.02)
model.save_pretrained(out, max_shard_size="5GB")
tok.save_pretrained(out)
print("made", out, sum(p.numel() for p in model.parameters()), "parameters")
