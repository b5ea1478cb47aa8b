#!/usr/bin/env bash
# Device call 1 (H200): build llama.cpp with CUDA from the pruned llama-cpp-python 0.3.36 source
# and make an 8B-shaped random-weight llama with the demo tokenizer. Work folder: /root/qk.
set -euo pipefail
REPO=$(pwd); W=/root/qk; mkdir -p $W; cd $W
[ -d llama.cpp ] || tar xzf $REPO/.devcarry/llama.cpp.tar.gz
t=$(date +%s)
cmake -S llama.cpp -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_HTML=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF > $W/cmake.log 2>&1
cmake --build build -j16 --target llama-server llama-bench llama-quantize > $W/build.log 2>&1
echo "build_s $(( $(date +%s) - t ))"
t=$(date +%s)
python3 $REPO/bench/h200/make_model.py $REPO/.devcarry/tok $W/model
echo "model_s $(( $(date +%s) - t ))"
