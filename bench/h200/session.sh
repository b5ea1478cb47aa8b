#!/usr/bin/env bash
# One device call of an H200 session (a machine goes back 30 s after a call, /tmp with it), the
# calls back to back. Build first, here: `bash ../shared/tools/vllm-h200/build.sh` (it prints the
# chunks) and the .devwheels (bench/README.md: quantkit's wheel, datasketch, compressed-tensors).
#   put:      carry [".vllmcarry/bin", ".vllmcarry/pNN"]     bash bench/h200/session.sh put
#             (every chunk but the last, one call each)
#   measure:  carry [".vllmcarry/bin", ".vllmcarry/pLAST", ".devwheels"] (the last chunk on the
#             first measuring call; nothing but .devwheels later while the machine stays warm)
#             bash bench/h200/session.sh measure PROTOCOL-ARGS   (bench/h200/protocol.py's)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:/tmp/qkplug VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 VLLM_DISABLE_COMPILE_CACHE=1 QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
stop_engines() { pkill -9 -f "VLLM::Engine[C]ore|cli[.]main serve"; }
case $1 in
put) bash .vllmcarry/bin/put.sh | tail -n 2 ;;
measure)
  shift
  if [ ! -d /tmp/site/vllm ]; then bash .vllmcarry/bin/install.sh || exit 3; fi
  [ -d /tmp/qkplug ] || pip install -q --no-deps --no-index --target /tmp/qkplug .devwheels/*.whl
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv | tee "$OUT/gpu.csv"
  export QK_SESSION_S=${QK_SESSION_S:-560}  # protocol.py begins no start it cannot finish
  timeout -k 10 "$QK_SESSION_S" python3 bench/h200/protocol.py "$@"
  echo "protocol rc=$?"; stop_engines
  tar -czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null \
    && rm -f "$OUT"/*.log ;;
esac
