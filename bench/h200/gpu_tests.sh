#!/usr/bin/env bash
# Device, after the vLLM kit is installed: the tests marked gpu (and the vLLM engine's unit tests).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  QUANTKIT_HOME=/tmp/qkhome
python3 -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" tests/test_vllm.py 2>&1 | tail -n 25
