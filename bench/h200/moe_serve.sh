#!/usr/bin/env bash
# Device (vLLM kit in /tmp/site): the whole Qwen3-30B-A3B shape (48 layers) served by vLLM with
# --load-format dummy (weights drawn in place: speed does not depend on their values, and random
# routers spread tokens alike on both sides): bf16 against the W4A16 layout of quantkit's artifact
# (bench/results-moe/moe-artifact-config.json, the config.json our CLI wrote for the 8-layer copy,
# with 48 layers). Client: `vllm bench serve`, random dataset, 512 in / 256 out, ignore EOS, seed 1;
# 16 prompts at concurrency 1, 256 at 64. Flags as quantkit serve passes them.
# usage: bash bench/h200/moe_serve.sh   Results: $OUT/serve-moe-{bf16,w4a16}-c{1,64}.json
set -uo pipefail
W=/tmp/qkmoe-serve; mkdir -p $W
python3 bench/h200/make_moe.py $W/bf16 48 --config || exit 1
mkdir -p $W/w4a16 && cp $W/bf16/* $W/w4a16/
python3 - "$W/w4a16/config.json" bench/results-moe/moe-artifact-config.json <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1])); cfg["quantization_config"] = json.load(open(sys.argv[2]))["quantization_config"]
json.dump(cfg, open(sys.argv[1], "w"), indent=1)
PY
for kind in bf16 w4a16; do
  t=$(date +%s)
  python3 -m vllm.entrypoints.cli.main serve $W/$kind --load-format dummy --host 127.0.0.1 --port 8100 \
    --served-model-name m --max-model-len 2048 --gpu-memory-utilization 0.9 --block-size 16 \
    --max-num-seqs 64 --enable-chunked-prefill > $OUT/serve-moe-$kind.log 2>&1 &
  pid=$!
  python3 .vllmcarry/bin/qk_http.py wait http://127.0.0.1:8100/health 420 $pid || { echo "$kind server not ready"; tail -n 30 $OUT/serve-moe-$kind.log; }
  echo "$kind ready after $(( $(date +%s) - t )) s"
  for c in 1 64; do
    n=$([ $c = 1 ] && echo 16 || echo 256)
    python3 -m vllm.entrypoints.cli.main bench serve --backend openai --base-url http://127.0.0.1:8100 \
      --model m --tokenizer $W/$kind --dataset-name random --random-input-len 512 --random-output-len 256 \
      --ignore-eos --temperature 0 --seed 1 --num-prompts $n --max-concurrency $c --save-result \
      --result-dir $OUT --result-filename serve-moe-$kind-c$c.json 2>&1 | grep -E "Output token throughput|Median TPOT|Failed"
  done
  kill $pid; wait $pid 2>/dev/null
done
