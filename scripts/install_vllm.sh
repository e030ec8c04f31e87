#!/usr/bin/env bash
# Install vLLM 0.33.0 (CPU-only torch) next to kvoracle, so that
# `kvoracle check --engine vllm` can drive vLLM's real KVCacheManager.
#
# Usage:  scripts/install_vllm.sh            # venv in .venv-vllm
#         VENV_VLLM=/path/to/venv scripts/install_vllm.sh
#
# Environment:
#   VENV_VLLM        the virtual environment to create or reuse (default .venv-vllm)
#   PYTHON           the interpreter that creates it (default python3; 3.10+)
#   TORCH_INDEX_URL  where the CPU build of torch comes from
#                    (default https://download.pytorch.org/whl/cpu)
#
# Why not `pip install vllm`: vLLM's own requirements pull a CUDA build of torch
# (gigabytes) plus GPU-only packages. kvoracle only needs vLLM's scheduler-side
# Python code, so torch is installed first as a CPU build, vLLM and xgrammar
# with --no-deps, and then only the packages vLLM imports at import time. Every
# later pip call is constrained to the torch already installed, so no step can
# replace it with a CUDA build. pip's warnings about vLLM's unmet requirements
# (torchvision, torchaudio, a newer torch, ...) are expected and harmless here.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV_VLLM="${VENV_VLLM:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.33.0"
XGRAMMAR_VERSION="0.2.8"

if [[ ! -x "$VENV_VLLM/bin/python" ]]; then
    echo "creating $VENV_VLLM"
    "$PYTHON" -m venv "$VENV_VLLM"
fi
py="$VENV_VLLM/bin/python"
pip=("$py" -m pip install --disable-pip-version-check)

echo "1/5 torch==$TORCH_VERSION (CPU build)"
# Few retries: where the CPU index is unreachable, pip's configured find-links may still
# hold the CPU wheel, and the check below refuses anything else.
"${pip[@]}" --timeout 15 --retries 1 --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
"$py" - <<'EOF'
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
print(f"torch {torch.__version__} (CPU)")
EOF

# Pin the installed torch (e.g. 2.13.0+cpu) for every later step.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$py" -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraints"

echo "2/5 vllm==$VLLM_VERSION and xgrammar==$XGRAMMAR_VERSION (without dependencies)"
"${pip[@]}" -c "$constraints" --no-deps "vllm==$VLLM_VERSION"
"${pip[@]}" -c "$constraints" --no-deps "xgrammar==$XGRAMMAR_VERSION"

echo "3/5 the packages vLLM imports at import time"
"${pip[@]}" -c "$constraints" \
    packaging numpy psutil "pyzmq>=25" urllib3 regex msgspec "pydantic>=2.12" cbor2 \
    "transformers>=5.16.1,<5.21" "aiohttp>=3.14.4" "requests>=2.33" "oss-harmony>=0.0.11" \
    "openai>=2.25" "pillow>=13" pybase64 cachetools cloudpickle uvloop py-cpuinfo \
    "prometheus_client>=0.18" "apache-tvm-ffi==0.1.11" "fastapi>=0.133,<0.137" \
    "starlette>=1.0.1" partial-json-parser "llguidance>=1.7,<1.8"

echo "4/5 kvoracle (editable)"
"${pip[@]}" -c "$constraints" -e .

echo "5/5 checking the import"
"$py" -c 'import vllm.v1.core.kv_cache_manager'
"$py" - <<'EOF'
import torch
import vllm
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
print(f"vllm {vllm.__version__} with torch {torch.__version__}: OK")
EOF
echo "run: $VENV_VLLM/bin/kvoracle check --engine vllm"
