#!/usr/bin/env bash
# Install SGLang 0.5.23 on a CPU-only torch next to kvoracle, so that
# `kvoracle check --engine sglang --suite prefix-tree` can drive SGLang's real radix
# prefix cache (RadixCache and its token allocators) without a server or a GPU.
#
# Usage:  scripts/install_sglang.sh                         # SGLang 0.5.23 in .venv-sglang
#         VENV_SGLANG=/path/to/venv scripts/install_sglang.sh
#
# Environment:
#   VENV_SGLANG      the virtual environment to create or reuse (default .venv-sglang)
#   PYTHON           the interpreter that creates it (default python3; the wheel is built
#                    for 3.10 to 3.13)
#   TORCH_INDEX_URL  where the CPU build of torch comes from
#                    (default https://download.pytorch.org/whl/cpu)
#
# Why not `pip install sglang`: its requirements pin a CUDA torch 2.14.1 and dozens of
# GPU kernels (flashinfer, deep-gemm, cutlass, ...). kvoracle needs only the scheduler-side
# Python of the prefix cache, so torch 2.13.0 is installed first as a CPU build, and
# every later pip call is constrained to it through PIP_CONSTRAINT (a constraints file
# holding the installed torch), so that no dependency can pull a CUDA build. SGLang
# itself is installed with --no-deps; then only what importing the radix cache imports
# (measured: the modules below are what `import sglang.srt.mem_cache.radix_cache`
# reaches). Versions SGLang pins are used where it pins them; torch stays 2.13.0 (the
# radix cache does not depend on the difference). pip's warnings about SGLang's unmet
# requirements (torch 2.14.1, flashinfer, torchvision, ...) are expected here.
#
# torchvision: no CPU build of it matches torch 2.13.0 here, and a torchvision built for
# another torch fails at import ("operator torchvision::nms does not exist"). SGLang's
# configs package imports torchvision.transforms at import time (for an InternVL image
# preprocessor the cache never calls). kvoracle's adapter therefore stands a stub in for
# it in its own process (kvoracle.conformance.engines.sglang_import), after priming
# transformers' torchvision check so transformers never mistakes the stub for the real
# package; this script removes any torchvision a dependency installed, so the stub is
# used every time rather than a half-working build.
#
# Re-running on a complete environment (SGLang 0.5.23 imports through kvoracle's loader on
# a CPU torch, kvoracle is installed editable from this checkout with the test pins)
# checks it and stops without calling pip.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/cpu_venv.sh
source scripts/cpu_venv.sh

SGLANG_VERSION="0.5.23"
VENV_SGLANG="${VENV_SGLANG:-.venv-sglang}"
PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
TORCH_VERSION="2.13.0"

# What importing sglang.srt.mem_cache.radix_cache imports (numpy ... partial-json-parser),
# with the versions SGLang 0.5.23 pins where it pins one.
packages=(
    numpy packaging psutil requests tqdm pillow "pyzmq>=25.1.2" msgspec orjson pybase64 pydantic
    aiohttp starlette dill ipython triton gguf partial-json-parser
    "transformers==5.19.0" "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0"
    "openai==2.8.0"
)

# The test pins of requirements-dev.txt that the SGLang environment needs (`make test-sglang`).
mapfile -t test_pins < <(grep -E '^(pytest|pytest-xdist|hypothesis|attrs|icontract)==' requirements-dev.txt)

# Exits 0 when the environment's SGLang is the wanted release, importable through kvoracle's
# loader (the torchvision stub included) on a CPU torch.
check_sglang() {
    "$1" - "$SGLANG_VERSION" <<'EOF'
import sys
from importlib.metadata import version
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
assert version("sglang") == sys.argv[1], f"sglang {version('sglang')}, not {sys.argv[1]}"
from kvoracle.conformance.engines.sglang_import import import_sglang
api = import_sglang()
print(f"sglang {version('sglang')} with torch {torch.__version__} "
      f"(torchvision {'stubbed' if api.torchvision_stubbed else 'real'}): OK")
EOF
}

py="$VENV_SGLANG/bin/python"
if [[ -x "$py" ]] && check_kvoracle "$py" 2>/dev/null && check_sglang "$py" 2>/dev/null; then
    echo "$VENV_SGLANG is complete"
    echo "run: $VENV_SGLANG/bin/kvoracle check --engine sglang --suite prefix-tree"
    exit 0
fi

new_cpu_venv "$VENV_SGLANG"

echo "2/5 sglang==$SGLANG_VERSION (without dependencies)"
"${pip[@]}" --no-deps "sglang==$SGLANG_VERSION"

echo "3/5 the packages the radix cache imports at import time"
"${pip[@]}" "${packages[@]}"
# A torchvision pulled in by a dependency is built for another torch and fails at import;
# kvoracle's loader stubs it instead (see above).
if "$py" -m pip show --disable-pip-version-check torchvision > /dev/null 2>&1; then
    "$py" -m pip uninstall --disable-pip-version-check -y torchvision
fi

echo "4/5 kvoracle (editable) and the test pins: ${test_pins[*]}"
"${pip[@]}" -e . "${test_pins[@]}"

echo "5/5 checking the import"
check_kvoracle "$py"
check_sglang "$py"
echo "run: $VENV_SGLANG/bin/kvoracle check --engine sglang --suite prefix-tree"
