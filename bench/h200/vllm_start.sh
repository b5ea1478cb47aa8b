#!/usr/bin/env bash
# Device: a validation engine's start, variant by variant (bench/h200/vllm_start.py), two calls
# on one warm machine (CHUNK_MIB=44 kit: bash ../shared/tools/vllm-h200/build.sh):
#   put: carry [".vllmcarry/bin", ".vllmcarry/p00"]  bash bench/h200/decode_kv.sh put
#        (parks p00; the 8B shape's config and tokenizer in /tmp/kvmodel: weights dummy)
#   run: carry [".vllmcarry/bin", ".vllmcarry/p01", ".vllmcarry/p02"]
#        bash bench/h200/vllm_start.sh [VARIANT...]   (default: compiled graphs eager capped)
#   or after recipe_8b.sh quantize (which parks p00): QK_MODEL=/tmp/qk8b/model, the same shape;
#   QK_TIMEOUT (s, default 560) ends it early: each variant's row is written as it finishes
set -uo pipefail
[ -d /tmp/site/vllm ] || { bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; }
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
timeout "${QK_TIMEOUT:-560}" python3 bench/h200/vllm_start.py "${QK_MODEL:-/tmp/kvmodel}" "$OUT/vllm-start.json" \
  ${@:-compiled graphs eager capped}
nvidia-smi --query-gpu=name --format=csv,noheader
