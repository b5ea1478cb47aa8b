#!/usr/bin/env bash
# Device: a validation engine's start, variant by variant (bench/h200/vllm_start.py), two calls
# on one warm machine (CHUNK_MIB=44 kit: bash ../shared/tools/vllm-h200/build.sh):
#   put: carry [".vllmcarry/bin", ".vllmcarry/p00"]  bash bench/h200/vllm_start.sh put
#        (parks p00; writes the Llama-3.1-8B shape's config: weights dummy)
#   run: carry [".vllmcarry/bin", ".vllmcarry/p01", ".vllmcarry/p02"]
#        bash bench/h200/vllm_start.sh run [VARIANT...]   (default: default eager graphs capped)
set -uo pipefail
M=/tmp/startmodel
case $1 in
put)
  bash .vllmcarry/bin/put.sh | tail -n 2
  python3 - <<'PY'
from transformers import LlamaConfig
LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=131072, rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False, torch_dtype="bfloat16").save_pretrained("/tmp/startmodel")
print("config in /tmp/startmodel")
PY
  ;;
run)
  [ -d /tmp/site/vllm ] || { bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; }
  export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
  shift; set -- "${@:-default eager graphs capped}"
  timeout 560 python3 bench/h200/vllm_start.py $M "$OUT/vllm-start.json" $*
  nvidia-smi --query-gpu=name --format=csv,noheader ;;
esac
