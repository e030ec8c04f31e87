#!/usr/bin/env bash
# Check the spec's icontract conditions with CrossHair.
#
# CrossHair explores every function of the spec chapters that carries icontract
# conditions, looking for an input that satisfies the preconditions but breaks a
# postcondition (or raises). Functions without contracts -- hash_block, which calls
# sha256, and the other helpers CrossHair cannot reason about -- are not analysed.
#
# Each condition gets a CPU-time budget (CROSSHAIR_TIMEOUT seconds, default 4), so
# the run is bounded by roughly (number of conditions) x budget; about 80 s today.
# Exit status: 0 no counterexample, 1 counterexample(s) found, 2 other error.
#
# Usage: scripts/crosshair_spec.sh [extra crosshair check options]
#   VENV=/path/to/venv        virtual environment holding crosshair (default .venv)
#   CROSSHAIR_TIMEOUT=SECONDS per-condition CPU-time budget (default 4)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${VENV:-.venv}"
BIN="${VENV}/bin"
TIMEOUT="${CROSSHAIR_TIMEOUT:-4}"
# CrossHair checks the icontract conditions, so they must be installed (spec/contracts.py).
export KVORACLE_CONTRACTS=1

if [[ ! -x "${BIN}/crosshair" ]]; then
    echo "crosshair_spec.sh: ${BIN}/crosshair not found (set VENV to a venv with crosshair-tool)" >&2
    exit 2
fi

# Makes icontract's re-entrancy set concrete; without it CrossHair reports spurious
# NotDeterministic / RecursionError failures on spec functions that call other
# contracted functions (see the plugin's docstring).
PLUGIN=scripts/crosshair_icontract_plugin.py

# The chapters, by their installed module names (kvoracle.spec.* maps to spec/):
# every module listed in kvoracle.spec.CHAPTERS, so a new chapter is checked too.
chapters="$("${BIN}/python" -c \
    'import kvoracle.spec as s; print("\n".join(c.__name__ for c in s.CHAPTERS))')" || {
    echo "crosshair_spec.sh: kvoracle.spec does not import with ${BIN}/python" >&2
    exit 2
}
mapfile -t MODULES <<<"${chapters}"
if [[ ${#MODULES[@]} -eq 0 || -z "${MODULES[0]}" ]]; then
    echo "crosshair_spec.sh: kvoracle.spec.CHAPTERS is empty" >&2
    exit 2
fi

echo "crosshair: $("${BIN}/python" -c 'import importlib.metadata as m; print(m.version("crosshair-tool"))')"
echo "checking icontract conditions, ${TIMEOUT}s CPU per condition, in:"
for module in "${MODULES[@]}"; do
    echo "  ${module}"
done

start=${SECONDS}
status=0
"${BIN}/crosshair" check \
    --analysis_kind=icontract \
    --per_condition_timeout="${TIMEOUT}" \
    --extra_plugin="${PLUGIN}" \
    "$@" \
    "${MODULES[@]}" || status=$?
elapsed=$((SECONDS - start))

case ${status} in
    0) echo "crosshair: no counterexample found (${elapsed}s)" ;;
    1) echo "crosshair: COUNTEREXAMPLE(S) FOUND (${elapsed}s), see above" >&2 ;;
    *) echo "crosshair: error, exit status ${status} (${elapsed}s)" >&2 ;;
esac
exit "${status}"
