#!/usr/bin/env bash
# Device: the FP8 KV cache against bf16 where decode dominates (issue 49), two calls on one warm
# machine (CHUNK_MIB=44 kit: bash ../shared/tools/vllm-h200/build.sh):
#   put: carry [".vllmcarry/bin", ".vllmcarry/p00"]  bash bench/h200/decode_kv.sh put
#        (parks p00; writes the 8B shape's config, 32k positions, and a tokenizer: weights dummy)
#   run: carry [".vllmcarry/bin", ".vllmcarry/p01", ".vllmcarry/p02"]
#        bash bench/h200/decode_kv.sh run [USERS CONTEXT STEPS REPEATS STARTS]  (default 8 20000 256 3 1)
set -uo pipefail
M=/tmp/kvmodel
case $1 in
put)
  bash .vllmcarry/bin/put.sh | tail -n 2
  python3 - <<'PY'
import sys
sys.path.insert(0, "tests")
from transformers import LlamaConfig
from _models import code_tokenizer
tok = code_tokenizer("/tmp/kvmodel")
LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=32768, rope_theta=500000.0, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
            torch_dtype="bfloat16").save_pretrained("/tmp/kvmodel")
print("config and tokenizer in /tmp/kvmodel")
PY
  ;;
run)
  [ -d /tmp/site/vllm ] || { bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; }
  export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
  shift; set -- "${@:-8 20000 256 3 1}"
  timeout 560 python3 bench/h200/decode_kv.py $M "$OUT/decode-kv.json" $*
  cp /tmp/decode-*.log "$OUT/" 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader ;;
esac
