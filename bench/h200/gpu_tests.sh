#!/usr/bin/env bash
# Device: every test marked gpu (vLLM engine, validate and KL on vLLM, mixed precision, auto --load
# on vLLM, the dual kernel, the CUDA-graphed GPTQ sweep), in calls of at most 10 minutes:
#   put (every vLLM kit chunk but the last, one call each):
#     carry [".vllmcarry/bin", ".vllmcarry/pNN"]          bash bench/h200/session.sh put
#   tests (the first call carries the last chunk; later calls on the warm machine need only
#   .devwheels): carry [".vllmcarry/bin", ".vllmcarry/pLAST", ".devwheels"]
#     bash bench/h200/gpu_tests.sh [PYTEST-ARGS, e.g. -k "agree or names or kl_on"]
# .devwheels: quantkit's own wheel (vLLM finds the dual kernel's plugin through its entry point),
# compressed-tensors 0.20.1, datasketch; the device image has torch, transformers and pytest.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:/tmp/qkplug VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/vllm ]; then bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; fi
[ -d /tmp/qkplug ] || pip install -q --no-deps --no-index --target /tmp/qkplug .devwheels/*.whl
python3 -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu -rs \
  --durations=0 --junitxml="${OUT:-/tmp}/gpu-tests.xml" tests/engines/test_vllm.py \
  tests/quantize/test_gptq.py "$@" 2>&1 | tail -n 40
