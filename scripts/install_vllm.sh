#!/usr/bin/env bash
# Install a vLLM release from 0.14.0 to 0.33.0 (default 0.33.0) on a CPU-only torch
# next to kvoracle, so that `kvoracle check --engine vllm` can drive vLLM's real
# KVCacheManager.
#
# Usage:  scripts/install_vllm.sh                          # vLLM 0.33.0 in .venv-vllm
#         VLLM_VERSION=0.22.0 scripts/install_vllm.sh      # vLLM 0.22.0 in .venv-vllm-0.22.0
#         VENV_VLLM=/path/to/venv scripts/install_vllm.sh
#
# Environment:
#   VLLM_VERSION     the vLLM release, 0.14.0 to 0.33.0 (default 0.33.0)
#   VENV_VLLM        the virtual environment to create or reuse (default .venv-vllm for
#                    0.33.0, .venv-vllm-$VLLM_VERSION for any other release)
#   PYTHON           the interpreter that creates it (default python3; 3.10 to 3.13)
#   TORCH_INDEX_URL  where the CPU build of torch comes from
#                    (default https://download.pytorch.org/whl/cpu)
#
# Why not `pip install vllm`: vLLM's own requirements pull a CUDA build of torch
# (gigabytes) plus GPU-only packages. kvoracle only needs vLLM's scheduler-side
# Python code, so torch is installed first as a CPU build, vLLM and xgrammar
# with --no-deps, and then only the packages vLLM imports at import time. Every
# later pip call is constrained to the torch already installed, so no step can
# replace it with a CUDA build. Every release runs on the same torch 2.13.0 (CPU),
# whatever torch it pins (0.14.x pins 2.9.1, 0.22.x 2.11.0): the scheduler-side
# code does not depend on it. pip's warnings about vLLM's unmet requirements
# (torchvision, torchaudio, another torch, ...) are expected and harmless here.
#
# Re-running on a complete environment (the wanted vLLM imports, kvoracle and the
# test pins are installed) checks it and stops without calling pip.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/cpu_venv.sh
source scripts/cpu_venv.sh

VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
if [[ "$VLLM_VERSION" == 0.33.0 ]]; then
    VENV_VLLM="${VENV_VLLM:-.venv-vllm}"
else
    VENV_VLLM="${VENV_VLLM:-.venv-vllm-$VLLM_VERSION}"
fi
PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
TORCH_VERSION="2.13.0"

if [[ ! "$VLLM_VERSION" =~ ^0\.(1[4-9]|2[0-9]|3[0-3])\.[0-9]+$ ]]; then
    echo "install_vllm.sh: vLLM $VLLM_VERSION is not supported (0.14.0 to 0.33.0)" >&2
    exit 2
fi
minor="${VLLM_VERSION#0.}"
minor="${minor%%.*}"   # 14 for 0.14.1

# --- What every release imports at import time. ---------------------------------------
packages=(
    packaging numpy psutil "pyzmq>=25" urllib3 regex msgspec "pydantic>=2.12" cbor2
    pybase64 cachetools cloudpickle py-cpuinfo "prometheus_client>=0.18"
)

# --- Per release (case on the minor version): what differs. -----------------------------
# Bounds are each release's own requirements (its wheel's metadata), narrowed where noted;
# a package appears only for the releases that import it at import time.

# xgrammar (installed --no-deps: it requires triton) and the apache-tvm-ffi it needs. Where
# a release gives a range, the newest xgrammar that fits the tvm-ffi the release pins.
case "$minor" in
    1[4-7]) xgrammar="xgrammar==0.1.29" tvm_ffi=() ;;          # pinned; no tvm-ffi yet
    1[89] | 20) xgrammar="xgrammar==0.1.34" tvm_ffi=("apache-tvm-ffi==0.1.9") ;;  # >=0.1.32
    2[1-5]) xgrammar="xgrammar==0.2.5.post1" tvm_ffi=("apache-tvm-ffi==0.1.9") ;; # >=0.2.0
    26) xgrammar="xgrammar==0.2.7" tvm_ffi=("apache-tvm-ffi==0.1.10") ;;
    2[7-9] | 3[01]) xgrammar="xgrammar==0.2.7" tvm_ffi=("apache-tvm-ffi==0.1.11") ;; # 0.31 pins it
    3[23]) xgrammar="xgrammar==0.2.8" tvm_ffi=("apache-tvm-ffi==0.1.11") ;;
esac
packages+=("${tvm_ffi[@]}")

# transformers: 4.x before 0.20 (0.19.0 requires <5; 0.19.1 would allow 5.5.3+); from 0.20
# on 5.x (vLLM excludes 5.0 to 5.5.0), capped below 5.21 as 0.33 caps it: newer ones are
# not what these releases were tested with (0.28 still imports with 5.24).
case "$minor" in
    1[4-9]) packages+=("transformers>=4.56,<5") ;;
    2[0-8]) packages+=("transformers>=5.5.3,<5.21") ;;
    29 | 30) packages+=("transformers>=5.10.4,<5.21") ;;
    31) packages+=("transformers>=5.10.4,<5.18") ;;
    32) packages+=("transformers>=5.16.1,<5.20") ;;
    33) packages+=("transformers>=5.16.1,<5.21") ;;
esac

# llguidance: 1.3.x until 0.21, 1.7.x from 0.22 on.
case "$minor" in
    1[4-9] | 2[01]) packages+=("llguidance>=1.3,<1.4") ;;
    *) packages+=("llguidance>=1.7,<1.8") ;;
esac

# openai: 0.17/0.18 cap it below 2.25; 0.19 needs 2.x, 0.30 2.25.
case "$minor" in
    1[4-6]) packages+=("openai>=1.99.1") ;;
    1[78]) packages+=("openai>=1.99.1,<2.25") ;;
    19 | 2[0-9]) packages+=("openai>=2.0") ;;
    *) packages+=("openai>=2.25") ;;
esac

# The harmony tokenizer was published as openai-harmony until 0.30, as oss-harmony from 0.31.
case "$minor" in
    1[4-9] | 2[0-9] | 30) packages+=("openai-harmony>=0.0.3") ;;
    *) packages+=("oss-harmony>=0.0.11") ;;
esac

# fastapi: 0.14 imports it through its OpenAI protocol module, 0.30 on again (with
# partial-json-parser); 0.15 to 0.29 import neither.
case "$minor" in
    14) packages+=("fastapi>=0.115") ;;
    3[0-3]) packages+=("fastapi>=0.133,<0.137" "starlette>=1.0.1" partial-json-parser) ;;
esac

# blake3 (multimodal hasher) only 0.14 imports at import time; uvloop 0.19 on.
case "$minor" in
    14) packages+=(blake3) ;;
    19 | 2[0-9] | 3[0-3]) packages+=(uvloop) ;;
esac

# aiohttp, requests, pillow: 0.32 and 0.33 raise the floors.
case "$minor" in
    1[4-9] | 2[0-9] | 3[01]) packages+=("aiohttp>=3.13.3" "requests>=2.26" pillow) ;;
    32) packages+=("aiohttp>=3.14.3" "requests>=2.33" "pillow>=12.3") ;;
    33) packages+=("aiohttp>=3.14.4" "requests>=2.33" "pillow>=13") ;;
esac

# Imported at import time by older releases only: gguf (by transformers_utils), until 0.23;
# diskcache (by v1.structured_output.utils, lazily from 0.20 on), until 0.19;
# mistral_common (by vllm.tokenizers.mistral), until 0.16.
case "$minor" in
    1[4-6]) packages+=("gguf>=0.17" "diskcache==5.6.3" "mistral_common>=1.8.8") ;;
    1[7-9]) packages+=("gguf>=0.17" "diskcache==5.6.3") ;;
    2[0-3]) packages+=("gguf>=0.17") ;;
esac

# The test pins of requirements-dev.txt that the vLLM environment needs (`make test-vllm`).
mapfile -t test_pins < <(grep -E '^(pytest|pytest-xdist|hypothesis|attrs|icontract)==' requirements-dev.txt)

# Exits 0 when the environment holds the wanted vLLM, importable with every module
# kvoracle's vLLM engines use, on a CPU torch.
check_vllm() {
    "$1" - "$VLLM_VERSION" <<'EOF'
import sys
import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
    MambaSpec, SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus
import vllm.v1.core.block_pool
import vllm.v1.core.kv_cache_coordinator
import vllm.v1.core.single_type_kv_cache_manager
from vllm.utils.hashing import sha256  # there in every release from 0.14.0 on
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
assert vllm.__version__ == sys.argv[1], f"vllm {vllm.__version__}, not {sys.argv[1]}"
print(f"vllm {vllm.__version__} with torch {torch.__version__} (sha256 in {sha256.__module__}): OK")
EOF
}

py="$VENV_VLLM/bin/python"
if [[ -x "$py" ]] && check_vllm "$py" 2>/dev/null && check_kvoracle "$py" 2>/dev/null; then
    echo "$VENV_VLLM is complete"
    echo "run: $VENV_VLLM/bin/kvoracle check --engine vllm"
    exit 0
fi

new_cpu_venv "$VENV_VLLM"

echo "2/5 vllm==$VLLM_VERSION and $xgrammar (without dependencies)"
"${pip[@]}" --no-deps "vllm==$VLLM_VERSION" "$xgrammar"

echo "3/5 the packages vLLM $VLLM_VERSION imports at import time"
"${pip[@]}" "${packages[@]}"

echo "4/5 kvoracle (editable) and the test pins: ${test_pins[*]}"
"${pip[@]}" -e . "${test_pins[@]}"

echo "5/5 checking the import"
check_vllm "$py"
check_kvoracle "$py"
echo "run: $VENV_VLLM/bin/kvoracle check --engine vllm"
