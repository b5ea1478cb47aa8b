#!/usr/bin/env bash
# Device call 2 (H200): F16 GGUF with llama.cpp's converter, Q4_K_M with llama-quantize, then
# llama-bench (the reference numbers) on both.
set -euo pipefail
REPO=$(pwd); W=/root/qk; cd $W
t=$(date +%s)
[ -f f16.gguf ] || PYTHONPATH=llama.cpp/gguf-py python3 llama.cpp/convert_hf_to_gguf.py model --outtype f16 --outfile f16.gguf > convert.log 2>&1
[ -f q4km.gguf ] || build/bin/llama-quantize f16.gguf q4km.gguf Q4_K_M > quantize.log 2>&1
echo "convert_quantize_s $(( $(date +%s) - t ))"
rm -rf model
for m in f16 q4km; do
  build/bin/llama-bench -m $m.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json > $OUT/llama-bench-$m.json 2> /dev/null
done
build/bin/llama-bench -m q4km.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -ub 1,512 -o md 2>/dev/null | tail -4
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv
