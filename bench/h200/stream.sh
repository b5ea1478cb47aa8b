#!/usr/bin/env bash
# Device: `quantkit quantize --method gptq` on LAYERS decoder layers of the 8B shape
# (bench/h200/make_small.py, hidden 4096, MLP 14336, vocabulary 128256), with --stream (each layer
# read from the shards when its turn comes) and --no-stream (the whole model loaded first), in
# that order, same calibration set; each run's manifest (wall time, peak CPU RSS and GPU memory).
# usage: bash bench/h200/stream.sh [LAYERS] [SAMPLES]   carry: [.whl]
# Results: $OUT/stream-{on,off}.json
set -uo pipefail
L=${1:-8}; S=${2:-128}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qk-site .whl/base/*.whl || exit 1
export PYTHONPATH=/tmp/qk-site:$PWD QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
W=/tmp/qkstream; mkdir -p $W
python3 bench/h200/make_small.py $W/m 4096 14336 $L 8 128256 || exit 1
python3 -m quantkit -q calibrate $W/m --source builtin:stdlib-docs@0.5 --source builtin:stdlib-code@0.5 \
  --samples $S --min-tokens 2048 --max-tokens 2048 --out $W/calib --force || exit 1
for mode in on off; do
  flag=$([ $mode = on ] && echo --stream || echo --no-stream)
  python3 -m quantkit -q --json quantize $W/m --method gptq --group-size 128 --calib $W/calib \
    --out $W/q-$mode --device cuda --force $flag > $OUT/stream-$mode.json || tail -c 2000 $OUT/stream-$mode.json
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[2], m['wall_time_s'], m['peak_memory'], m['timings'])" $OUT/stream-$mode.json $mode
done
