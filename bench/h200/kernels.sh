#!/usr/bin/env bash
# What issue 22 still needs from the H200, as back-to-back device calls (a machine goes back 30 s
# after a call, /tmp with it). Build first, here: `bash ../shared/tools/vllm-h200/build.sh` (2
# chunks) and `pip wheel --no-deps --no-build-isolation -w .devwheels . && pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --implementation cp
# -d .devwheels datasketch compressed-tensors==0.20.1` (.devwheels: quantkit's wheel, whose
# entry point vLLM reads to load the dual kernel, and what the gpu tests import).
#   1: carry [".vllmcarry/bin", ".vllmcarry/p00"]                 bash bench/h200/kernels.sh 1
#   2: carry [".vllmcarry/bin", ".vllmcarry/p01", ".devwheels"]   bash bench/h200/kernels.sh 2
#      `auto --load` on vLLM (QK_TEST_S=540; 444 s of pytest, passed 2026-12-03 late;
#      QK_TESTS=dual_kernel for the dual kernel against Marlin on the GPTQ test artifact, 143 s,
#      passed 2026-12-03)
#   jobs: call 2's carry, QK_JOBS="w8a16 ..." QK_BUDGET_S=.. QK_JOBS_S=..: formats.py jobs in
#      the second call (a session with too little device time left for three calls)
#   3: carry []   bash bench/h200/kernels.sh 3: bf16 and every FP8 (ours per token and static,
#      vLLM's online) at 1 and 64 in one call: per-token FP8 at 64 was 0.81x bf16 on 2026-12-02
#      and 1.19x on 2026-12-03 late, each against its own session's bf16
#   4: carry []   bash bench/h200/kernels.sh 4: the FP8 KV cache at 32 users of 32k tokens in with
#      2,048 out (decode-bound; at 256 out it was 0.98x, bound by prefill, 2026-12-03 late)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:/tmp/qkplug VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 VLLM_DISABLE_COMPILE_CACHE=1 QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
# engine processes only (the brackets keep the pattern from matching a shell that runs it)
stop_engines() { pkill -9 -f "VLLM::Engine[C]ore|cli[.]main serve"; }
case $1 in
1) bash .vllmcarry/bin/put.sh | tail -n 2 ;;
2|jobs)
  bash .vllmcarry/bin/install.sh || exit 3
  pip install -q --no-deps --no-index --target /tmp/qkplug .devwheels/*.whl 2>/dev/null
  if [ "$1" = jobs ]; then  # formats.py jobs in the carrying call itself, when time is short
    QK_QB=0 timeout -k 5 "${QK_JOBS_S:-540}" python3 bench/h200/formats.py ${QK_JOBS}
    stop_engines; exit 0
  fi
  # `vllm` on PATH for `quantkit serve` (auto --load serves with the defaults), and its python
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' \
    > /tmp/bin/vllm && chmod +x /tmp/bin/vllm && ln -sf "$(command -v python3)" /tmp/bin/python
  export PATH=/tmp/bin:$PATH
  # into a file, not a pipe: an engine process a failed test leaves behind keeps a pipe open
  timeout -k 10 ${QK_TEST_S:-540} python3 -m pytest -q -p no:cacheprovider \
    -o addopts="--import-mode=importlib" -m gpu -k "${QK_TESTS:-auto_load}" -rs \
    tests/engines/test_vllm.py > "$OUT/gpu-tests.log" 2>&1 < /dev/null
  echo "pytest rc=$?"; stop_engines; tail -c 6000 "$OUT/gpu-tests.log"
  # what the servers wrote (left behind when the timeout stops the test before its clean-up)
  find /tmp/pytest-of-* -name "*.log" -size -4M 2>/dev/null | tar -czf "$OUT/test-logs.tgz" -T - ;;
3|4)
  [ -d /tmp/site/vllm ] || { echo "no vLLM kit: run calls 1 and 2 first, back to back"; exit 3; }
  if [ "$1" = 3 ]; then
    export QK_LEVELS=1,64; jobs="bf16 fp8 fp8-static fp8-online"
  else
    jobs="kv-bf16-32k-c32-long kv-fp8-32k-c32-long"
  fi
  QK_QB=0 QK_BUDGET_S=570 python3 bench/h200/formats.py $jobs
  cp /tmp/qkfmt/*.log "$OUT"/ 2>/dev/null ;;
esac
