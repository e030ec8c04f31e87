#!/usr/bin/env bash
# The zoo (docs/zoo.md): each historical vLLM bug convicted on the releases that had it,
# and a clean run on the releases after its fix.
#
# Usage:  scripts/zoo.sh [RELEASE ...]        # default: the releases of docs/zoo.md
#         ZOO_RELEASES=all scripts/zoo.sh     # every release from 0.14.0 to 0.33.0
#
# One virtual environment per release, built by scripts/install_vllm.sh into a cache
# ($ZOO_VENVS, default ~/.cache/kvoracle/vllm/<release>) and reused on later runs; one
# report per release in build/zoo/<release>.json; then the table of every report there.
# Exits 1 when a bug is missed on a release that has it or charged on one that does not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ZOO_VENVS="${ZOO_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvoracle/vllm}"
DEFAULT="0.14.1 0.15.1 0.19.1 0.20.0 0.22.0 0.27.1 0.28.0 0.29.0 0.32.0 0.33.0"
ALL="0.14.0 0.14.1 0.15.0 0.15.1 0.16.0 0.17.0 0.17.1 0.18.0 0.18.1 0.19.0 0.19.1 0.20.0 0.20.1
0.20.2 0.21.0 0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0
0.31.0 0.32.0 0.33.0"
if [[ $# -gt 0 ]]; then releases="$*"
elif [[ "${ZOO_RELEASES:-}" == all ]]; then releases="$ALL"
else releases="${ZOO_RELEASES:-$DEFAULT}"; fi
python="${PYTHON_KVORACLE:-.venv/bin/python}"

mkdir -p build/zoo
status=0
for release in $releases; do
    venv="$ZOO_VENVS/$release"
    echo "== vLLM $release ($venv)"
    VLLM_VERSION="$release" VENV_VLLM="$venv" bash scripts/install_vllm.sh > "build/zoo/$release.install.log" 2>&1 \
        || { echo "   install failed: build/zoo/$release.install.log"; status=1; continue; }
    "$venv/bin/python" benchmarks/zoo.py --json "build/zoo/$release.json" || status=1
done
"$python" benchmarks/zoo.py --summarize build/zoo/*.json || status=1
exit $status
