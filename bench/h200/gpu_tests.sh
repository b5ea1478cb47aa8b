#!/usr/bin/env bash
# Device, after the vLLM kit is installed: every test marked gpu (vLLM engine and validate on vLLM,
# the CUDA-graphed GPTQ sweep). pytest travels in .whl/extra (installed to /tmp/qk-extra).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra:/tmp/qk-site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 QUANTKIT_HOME=/tmp/qkhome
python3 -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu -rs tests/engines/test_vllm.py \
  tests/quantize/test_gptq.py 2>&1 | tail -n 30
