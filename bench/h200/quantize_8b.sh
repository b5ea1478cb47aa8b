#!/usr/bin/env bash
# Device: `quantkit quantize` (the CLI, not a bench path) on the whole 8B-shaped model, all 32
# layers, W4A16 g128, 256 x 2048 calibration tokens from `quantkit calibrate`; then llm-compressor
# on the same machine in the same call (1 decoder layer of the same shape, its own process: it keeps a
# global session). usage: bash bench/h200/quantize_8b.sh gptq|awq   carry: [.whl]
# Results: $OUT/quantize-8b-METHOD.json (our manifest), $OUT/llmc-METHOD.json, $OUT/wall-METHOD.txt
set -uo pipefail
method=$1
[ -d /tmp/qk-site/datasketch ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/qk-site .whl/datasketch-*.whl .whl/compressed_tensors-0.20.1-*.whl
[ -n "${QK_SKIP_LLMC:-}" ] || [ -d /tmp/llmc/llmcompressor ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/llmc .whl/llmc/*.whl
# pydantic and loguru (compressed-tensors needs them) come from the vLLM kit in /tmp/site when present
export PYTHONPATH=/tmp/qk-site:$PWD:/tmp/site QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
W=/tmp/qk; mkdir -p $W
t=$(date +%s)
[ -f $W/m8b/config.json ] || python3 bench/h200/make_small.py $W/m8b 4096 14336 32 8 128256
[ -f $W/calib8b/samples.jsonl ] || python3 -m quantkit -q calibrate $W/m8b --source builtin:stdlib-docs@0.5 \
  --source builtin:stdlib-code@0.5 --samples 256 --min-tokens 2048 --max-tokens 2048 --out $W/calib8b --force
echo "setup_s $(( $(date +%s) - t ))"
t=$(date +%s)
python3 -m quantkit -q --json quantize $W/m8b --method $method --group-size 128 --calib $W/calib8b \
  --out $W/m8b-$method --device cuda --force > $OUT/quantize-8b-$method.json
rc=$?; echo "quantize rc=$rc wall_s $(( $(date +%s) - t ))" | tee $OUT/wall-$method.txt
[ $rc = 0 ] || tail -c 1500 $OUT/quantize-8b-$method.json
du -sh $W/m8b-$method 2>/dev/null
[ -n "${QK_SKIP_LLMC:-}" ] && exit 0  # only our artifact is wanted (bench/h200/leftovers.sh)
PYTHONPATH=/tmp/llmc:$PWD timeout 200 python3 bench/quantize.py speed --engine llmc --method $method \
  --layers 1 --tokenizer $W/m8b --out $OUT/llmc-$method.json 2>&1 | grep -v METRIC | tail -n 6
