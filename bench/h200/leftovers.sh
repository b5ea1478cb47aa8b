#!/usr/bin/env bash
# What issues 12 and 13 still need from the H200, in four back-to-back device calls (a machine
# goes back 30 s after a call, and /tmp with it; about 25 device-minutes in all, a fifth if left):
#   1: [".vllmcarry/bin", ".vllmcarry/p00"]          kit chunk 1; the 8B-shaped bf16 model
#   2: [".vllmcarry/bin", ".vllmcarry/p01", ".whl/extra", ".whl/lm",
#       ".whl/datasketch-2.0.0-py3-none-any.whl", ".whl/compressed_tensors-0.20.1-py3-none-any.whl"]
#           (not .whl/llmc: with it the call nears its 64 MiB) kit installed; every test marked
#           gpu (vLLM serves a mixed-precision artifact, KL on vLLM against transformers, ...);
#           our GPTQ of the 8B-shaped model through the CLI
#   3: []   W4A16 at concurrency 64, 256 requests (four waves): hand (steered as quantkit's auto)
#           against quantkit:auto
#   4: []   the same, unsteered: hand:vllm against quantkit:vllm
#   5: []   bf16 by hand and through quantkit, the same load (the ratios' base), if time is left
# usage: bash bench/h200/leftovers.sh N   results under $OUT (serve-vllm.json, gpu-tests.txt, ...)
set -uo pipefail
step=$1; W=/tmp/qk; mkdir -p $W
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 \
  QUANTKIT_HOME=/tmp/qkhome NCCL_NVLS_ENABLE=0
since() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
T0=$(date +%s)
serve() {  # LABEL MODEL SERVER...: 256 requests at concurrency 64 (about 150 s a server)
  QK_LEVELS=64 QK_REQUESTS=256 PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra timeout 420 \
    python3 bench/h200/serve_vllm.py "$@"
}
case $step in
1)
  bash .vllmcarry/bin/put.sh | tail -n 2
  PYTHONPATH=$PWD python3 bench/h200/make_small.py $W/m8b 4096 14336 32 8 128256 | tail -n 1
  since model ;;
2)
  bash .vllmcarry/bin/install.sh | tail -n 2
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qk-extra .whl/extra/*.whl \
    $(ls .whl/lm/*.whl 2>/dev/null)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qk-site \
    .whl/datasketch-*.whl .whl/compressed_tensors-0.20.1-*.whl
  since installed
  timeout 560 bash bench/h200/gpu_tests.sh | tee $OUT/gpu-tests.txt
  since tests
  QK_SKIP_LLMC=1 timeout 240 bash bench/h200/quantize_8b.sh gptq | tail -n 4
  since quantized ;;
3)
  serve w4a16 $W/m8b-gptq hand quantkit:auto
  since steered ;;
4)
  serve w4a16-unsteered $W/m8b-gptq hand:vllm quantkit:vllm
  since unsteered ;;
5)
  serve bf16 $W/m8b hand quantkit
  since bf16 ;;
esac
cp $W/*.log $OUT/ 2>/dev/null; true
