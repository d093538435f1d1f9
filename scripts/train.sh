#!/usr/bin/env bash
# The main job: install what memplan needs, build it, and train the default model (the MLP on
# Fashion-MNIST). Extra arguments go to 'memplan train', e.g. scripts/train.sh --epochs 10 --json
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
memplan_install_deps
memplan_build build -DMEMPLAN_BUILD_TESTS=OFF -DMEMPLAN_BUILD_BENCH=OFF
./build/tools/memplan train "$@"
