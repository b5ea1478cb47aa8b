#!/usr/bin/env bash
# Device: setup.sh then convert.sh in one call (a fresh machine), about 6.5 minutes.
set -euo pipefail
bash bench/h200/setup.sh && bash bench/h200/convert.sh
