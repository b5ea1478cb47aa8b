#!/usr/bin/env bash
# Device: vLLM's CUTLASS W4A8 GEMM per tile schedule on the 8B linears (issue 49, item 2), two
# calls on one warm machine (CHUNK_MIB=44 kit: bash ../shared/tools/vllm-h200/build.sh):
#   put: carry [".vllmcarry/bin", ".vllmcarry/p00"]  bash bench/h200/decode_kv.sh put
#   run: carry [".vllmcarry/bin", ".vllmcarry/p01", ".vllmcarry/p02"]  bash bench/h200/w4a8_tiles.sh [ITERS]
# (about a minute once vLLM is installed). Writes $OUT/w4a8-tiles.json.
set -uo pipefail
[ -d /tmp/site/vllm ] || { bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; }
export PYTHONPATH=/tmp/site:$PWD VLLM_NO_USAGE_STATS=1
timeout 500 python3 bench/h200/w4a8_tiles.py "$OUT/w4a8-tiles.json" "${1:-200}"
nvidia-smi --query-gpu=name --format=csv,noheader
