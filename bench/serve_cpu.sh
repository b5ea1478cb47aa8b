#!/usr/bin/env bash
# CPU, side by side in one run: the demo Q4_K_M behind `quantkit serve` on llama-server (built by
# `quantkit setup llama-server`) and on the llama_cpp.server fallback, each load-tested by
# `quantkit bench` at concurrency 1 and 8. Results: reports/bench-cpu-{llama-server,llama_cpp.server}/
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=${REQ:-24}
for engine in llama-server llama_cpp.server; do
  [ "$engine" = llama-server ] && export QUANTKIT_LLAMA_SERVER= || export QUANTKIT_LLAMA_SERVER=off
  [ "$engine" = llama-server ] && unset QUANTKIT_LLAMA_SERVER
  quantkit -q serve artifacts/demo-gguf --port 8731 --max-num-seqs 8 > /dev/null 2>&1 &
  pid=$!
  until curl -sf http://127.0.0.1:8731/health > /dev/null; do sleep 0.5; done
  quantkit bench --url http://127.0.0.1:8731 --requests "$REQ" --concurrency 1,8 \
    --out "reports/bench-cpu-$engine" --force | tail -4
  kill -INT $pid; wait $pid || true
done
