# Shared by scripts/install_vllm.sh and scripts/install_sglang.sh (sourced, not run): a
# virtual environment on a CPU-only torch, where no later pip call can replace torch.
#
# The sourcing script sets PYTHON, TORCH_INDEX_URL, TORCH_VERSION and test_pins (the
# requirements-dev.txt pins it installs with kvoracle) and runs from the checkout's root.

# Exits 0 when kvoracle is installed editable from this checkout with the test pins.
check_kvoracle() {
    "$1" - "$PWD" "${test_pins[@]}" <<'PYEOF'
import os, sys
from importlib.metadata import version
import kvoracle
assert os.path.realpath(kvoracle.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep)
for pin in sys.argv[2:]:
    name, wanted = pin.split("==")
    assert version(name) == wanted, f"{name} {version(name)}, not {wanted}"
PYEOF
}

# new_cpu_venv VENV: create VENV if needed, install the CPU torch into it, and constrain every
# later pip call to that torch (PIP_CONSTRAINT). Sets py (its python) and pip (its install
# command, as an array).
new_cpu_venv() {
    local venv="$1"
    py="$venv/bin/python"
    if [[ ! -x "$py" ]]; then
        echo "creating $venv"
        "$PYTHON" -m venv "$venv"
        # git ignores it wherever it lies (as venv does itself from Python 3.13 on).
        echo '*' > "$venv/.gitignore"
    fi
    pip=("$py" -m pip install --disable-pip-version-check)

    echo "1/5 torch==$TORCH_VERSION (CPU build)"
    # Few retries: where the CPU index is unreachable, pip's configured find-links may still
    # hold the CPU wheel, and the check below refuses anything else.
    "${pip[@]}" --timeout 15 --retries 1 --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
    "$py" - <<'PYEOF'
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
print(f"torch {torch.__version__} (CPU)")
PYEOF
    # Pin the installed torch (e.g. 2.13.0+cpu) for every later step, whatever pip call makes it.
    constraints="$(mktemp)"
    trap 'rm -f "$constraints"' EXIT
    "$py" -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraints"
    export PIP_CONSTRAINT="$constraints"
}
