#!/usr/bin/env bash
# Device, after the vLLM kit is installed (../shared/tools/vllm-h200): quantkit quantizes a small
# random llama with GPTQ and AWQ (W4A16 g128) on the GPU, written by compressed-tensors 0.20 (what
# CPU machines install), then vLLM 0.26 (its compressed-tensors 0.17) loads both and is compared
# with transformers on them, with vLLM's default kernel and with Marlin. Results: $OUT/vllm_check.json
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ct020 .whl/compressed_tensors-*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/datasketch-*.whl
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  PYTHONUNBUFFERED=1 QUANTKIT_HOME=/tmp/qkhome
W=/tmp/qk; mkdir -p $W
python3 bench/h200/make_small.py $W/small
python3 -m quantkit -q calibrate $W/small --source builtin:stdlib-docs@0.5 --source builtin:stdlib-code@0.5 \
  --samples 64 --min-tokens 512 --max-tokens 512 --out $W/calib --force
for m in gptq awq; do
  PYTHONPATH=/tmp/ct020:$PYTHONPATH python3 -m quantkit -q --json quantize $W/small --method $m \
    --calib $W/calib --out $W/small-$m --device cuda --force > $OUT/quantize-$m.json || tail -5 $OUT/quantize-$m.json
done
grep -h '"version"' $W/small-gptq/config.json | head -2
python3 bench/h200/vllm_check.py --kernels default,marlin --out $OUT/vllm_check.json $W/small-gptq $W/small-awq
