# The two commands of the README. Each sets itself up on a fresh machine: a virtual
# environment in .venv with the pinned development tools and kvoracle installed editable.
# `make test` also puts a CPU build of torch into .venv (kvoracle.gpu's tests and the
# `gpu` engine run on it); it never installs a CUDA build.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvoracle-installed
TORCH_STAMP := $(VENV)/.kvoracle-torch-cpu
CHROMIUM_STAMP := $(VENV)/.kvoracle-chromium
CHROMIUM := /usr/bin/chromium
REDIS_STAMP := $(VENV)/.kvoracle-redis
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

.PHONY: check test test-vllm test-vllm-release test-sglang test-sglang-ci zoo lint crosshair docs clean

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

# torch from the CPU index (few retries: where it is unreachable, pip's configured
# find-links may hold the CPU wheel); anything but a CPU build is refused.
$(TORCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --timeout 15 --retries 1 \
		--index-url $(TORCH_INDEX_URL) "torch==$(TORCH_VERSION)"
	$(BIN)/python -c "import torch; assert torch.version.cuda is None, \
		f'torch {torch.__version__} is a CUDA build'"
	touch $(TORCH_STAMP)

# Debian's Chromium, which the HTML report's browser test (tests/test_html_report.py) opens the
# report in: installed with apt-get when missing and make runs as root, else an error saying what
# to do. KVORACLE_NO_BROWSER=1 installs nothing (that test is then skipped, and says why).
$(CHROMIUM_STAMP): $(STAMP)
	@if [ "$(KVORACLE_NO_BROWSER)" = 1 ]; then \
		echo "KVORACLE_NO_BROWSER=1: not installing chromium; the HTML report's browser test is skipped"; \
	else \
		if [ ! -x $(CHROMIUM) ]; then \
			if [ "$$(id -u)" = 0 ]; then \
				apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || exit 1; \
			else \
				echo "error: $(CHROMIUM) is missing; the HTML report's browser test needs it." \
					"Install it as root (apt-get install -y chromium), or set KVORACLE_NO_BROWSER=1" \
					"to skip that test knowingly." >&2; \
				exit 1; \
			fi; \
			test -x $(CHROMIUM) || { echo "error: apt-get installed no $(CHROMIUM)" >&2; exit 1; }; \
		fi; \
		touch $@; \
	fi

# Debian's redis-server, which the shared example database's test (tests/test_database.py) starts
# on a free loopback port: installed like chromium. KVORACLE_NO_REDIS=1 installs nothing (that
# test is then skipped, and says why).
$(REDIS_STAMP): $(STAMP)
	@if [ "$(KVORACLE_NO_REDIS)" = 1 ]; then \
		echo "KVORACLE_NO_REDIS=1: not installing redis-server; the shared-database test is skipped"; \
	else \
		if ! command -v redis-server > /dev/null; then \
			if [ "$$(id -u)" = 0 ]; then \
				apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server || exit 1; \
			else \
				echo "error: redis-server is missing; the shared example database's test needs it." \
					"Install it as root (apt-get install -y redis-server), or set KVORACLE_NO_REDIS=1" \
					"to skip that test knowingly." >&2; \
				exit 1; \
			fi; \
		fi; \
		touch $@; \
	fi

## Run every conformance suite against the embedded reference engine and print the verdicts.
check: $(STAMP)
	$(BIN)/kvoracle check

## The project's own checks: lint, tests (incl. meta-tests and doc examples), a bounded
## conformance run of every suite with a JSON report, CrossHair over the spec, the docs site
## (make docs), the real vLLM engine (two releases) and SGLang's real caches.
test: $(STAMP) $(TORCH_STAMP) $(CHROMIUM_STAMP) $(REDIS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -n $(PYTEST_WORKERS) --durations=40
	$(BIN)/kvoracle check --json build/kvoracle-report.json
	bash scripts/crosshair_spec.sh
	$(MAKE) docs
	$(MAKE) test-vllm
	$(MAKE) test-vllm-release
	$(MAKE) test-sglang-ci

VENV_VLLM ?= .venv-vllm
# pytest-xdist workers for `make test` (auto: one per core; the tests that run kvoracle in
# child processes are spread over them too).
PYTEST_WORKERS ?= auto

## vLLM 0.33.0 on CPU torch (scripts/install_vllm.sh) with the dev pins of kvoracle's own dependencies
## (a seed draws the same examples in both environments), its adapters' tests, its zoo row (the manager,
## hybrid and store suites, 400 examples per manager part: 100 one-group ones let three broken vLLM
## engines through; 0.33.0's two align-mode Mamba bugs convicted and nothing else failing), and a
## bounded hybrid check.
test-vllm: $(STAMP)
	VENV_VLLM=$(VENV_VLLM) bash scripts/install_vllm.sh
	$(VENV_VLLM)/bin/python -m pip install --quiet $$(grep -E '^(pytest|pytest-xdist|hypothesis|attrs|icontract)==' requirements-dev.txt)
	$(VENV_VLLM)/bin/pytest -n $(PYTEST_WORKERS) tests/test_vllm_adapter.py tests/test_expectations.py tests/test_bench_vllm.py tests/test_mutants_vllm.py \
		tests/test_hybrid_vllm.py tests/test_hybrid_lifecycle_vllm.py tests/test_external_store_vllm.py \
		tests/test_findings_vllm.py tests/test_mamba_align_spec.py
	$(VENV_VLLM)/bin/python benchmarks/zoo.py --max-examples 400 --json build/zoo/0.33.0.json
	$(VENV_VLLM)/bin/kvoracle check --suite hybrid --engine vllm --max-examples 200 \
		--json build/kvoracle-vllm-hybrid-report.json

VENV_SGLANG ?= .venv-sglang

SGLANG_TESTS := tests/test_sglang_adapter.py tests/test_sglang_unified.py tests/test_sglang_paged_store.py \
	tests/test_sglang_swa.py tests/test_sglang_swa_store.py tests/test_sglang_mamba.py \
	tests/test_sglang_mamba_store.py

## SGLang 0.5.23 on CPU torch (scripts/install_sglang.sh): its adapters' tests (the real caches, and
## broken ones made by patching one method of its classes, each convicted by a whole suite run) and a
## bounded prefix-tree check with a JSON report.
test-sglang:
	VENV_SGLANG=$(VENV_SGLANG) bash scripts/install_sglang.sh
	$(VENV_SGLANG)/bin/pytest -n $(PYTEST_WORKERS) $(SGLANG_TESTS)
	$(VENV_SGLANG)/bin/kvoracle check --engine sglang --suite prefix-tree --max-examples 300 \
		--no-progress --json build/kvoracle-sglang-report.json

## The SGLang stage of `make test` (CI's time is bounded): the environment, every test of SGLang's
## real caches (each engine's pass run, every written case the real cache replays clean and its broken
## twin fails on its rule), and the bounded check. Left to `make test-sglang`: the broken caches'
## whole-run convictions (the tests named `*convicted*`, one Hypothesis search each, about two thirds
## of the time).
test-sglang-ci:
	VENV_SGLANG=$(VENV_SGLANG) bash scripts/install_sglang.sh
	$(VENV_SGLANG)/bin/pytest -n $(PYTEST_WORKERS) -k "not convicted" $(SGLANG_TESTS)
	$(VENV_SGLANG)/bin/kvoracle check --engine sglang --suite prefix-tree --max-examples 300 \
		--no-progress --json build/kvoracle-sglang-report.json

## One vLLM release other than 0.33 end to end: its environment, the manager and hybrid suites
## with its expected differences, and the zoo's verdicts on it (its real bugs convicted, nothing
## else failing).
VLLM_OTHER_RELEASE ?= 0.28.0
test-vllm-release: $(STAMP)
	bash scripts/zoo.sh $(VLLM_OTHER_RELEASE)

## The zoo (docs/zoo.md): historical vLLM bugs convicted on the releases that had them, one
## cached virtual environment per release (ZOO_RELEASES="0.22.0 0.28.0" for some, =all for every one).
zoo: $(STAMP)
	bash scripts/zoo.sh

## The documentation site (mkdocs.yml): the chapters, the rule table, results and the zoo, built
## offline with --strict (a broken link, anchor or nav entry fails) into build/site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

lint: $(STAMP)
	$(BIN)/ruff check .

crosshair: $(STAMP)
	bash scripts/crosshair_spec.sh

clean:
	rm -rf $(VENV) $(VENV_VLLM) $(VENV_SGLANG) build kvoracle-replays *.egg-info
