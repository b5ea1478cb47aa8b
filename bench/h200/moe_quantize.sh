#!/usr/bin/env bash
# Device: the Qwen3-30B-A3B-shaped MoE (bench/h200/make_moe.py; LAYERS of its 48 decoder layers,
# random bf16 weights) quantized with GPTQ W4A16 g128 by the CLI (`quantkit quantize --device cuda`)
# from 128 x 2048 tokens of `quantkit calibrate`; then llm-compressor 0.14.0.1's GPTQ (its MoE
# defaults) on the same model and samples in its own process, cut at what the call has left.
# usage: bash bench/h200/moe_quantize.sh [LAYERS]   carry: [.whl]  (.whl/base, .whl/llmc: see
# docs/BENCHMARKS.md). Results: $OUT/moe-quantize.json (our manifest), $OUT/moe-llmc.json or
# $OUT/moe-llmc.log (its per-layer progress when cut), $OUT/moe-artifact-config.json.
set -uo pipefail
L=${1:-8}; start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qk-site .whl/base/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmc .whl/llmc/*.whl || exit 1
export PYTHONPATH=/tmp/qk-site:$PWD QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
W=/tmp/qkmoe; mkdir -p $W; t=$(date +%s)
[ -f $W/m$L/config.json ] || python3 bench/h200/make_moe.py $W/m$L $L || exit 1
python3 -m quantkit -q calibrate $W/m$L --source builtin:stdlib-docs@0.5 --source builtin:stdlib-code@0.5 \
  --samples 128 --min-tokens 2048 --max-tokens 2048 --out $W/calib --force || exit 1
echo "setup_s $(( $(date +%s) - t ))"; df -h /tmp | tail -1; t=$(date +%s)
python3 -m quantkit -q --json quantize $W/m$L --method gptq --group-size 128 --calib $W/calib \
  --out $W/q$L --device cuda --force > $OUT/moe-quantize.json
rc=$?; echo "quantize rc=$rc wall_s $(( $(date +%s) - t ))"
[ $rc = 0 ] || tail -c 3000 $OUT/moe-quantize.json
cp $W/q$L/config.json $OUT/moe-artifact-config.json 2>/dev/null; du -sh $W/m$L $W/q$L
left=$(( 570 - ($(date +%s) - start) )); echo "llm-compressor gets ${left}s"
PYTHONPATH=/tmp/llmc:/tmp/qk-site:$PWD timeout $left python3 bench/h200/moe_llmc.py $W/m$L $W/calib \
  $OUT/moe-llmc.json > $OUT/moe-llmc.log 2>&1; echo "llmc rc=$?"
grep -v METRIC $OUT/moe-llmc.log | grep -iE "layer|calibrat|propagat|error|Traceback|[0-9]+/[0-9]+" | tail -n 25
