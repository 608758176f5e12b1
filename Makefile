# Every target sets up what it needs from the package index; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv-test

.PHONY: test check lint aarch64 demo demo-clean bench fuzz mutants clean

# The test command (CI runs it through .ci/run): a venv with the test tools (uv among them, which
# finds or installs interpreters); the lint; what the machine must have, checked before any test and
# said in one message; then the whole suite.
# TMS_TEST_STRICT=1 turns every skip into a failure (but the GPU check's on a machine without a GPU):
# green means every scenario ran.
test: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py test
	TMS_TEST_STRICT=1 $(VENV)/bin/python -m pytest -q -rs

# The fast lane for the edit loop: every test not marked slow (slow: real torch or Ray, other
# interpreters, root file systems, builds from the package index; see tests/conftest.py), after the lint.
check: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py check
	TMS_TEST_STRICT=1 $(VENV)/bin/python -m pytest -q -rs -m "not slow"

# ruff over everything (the rules in pyproject.toml: the package and tools/ annotated, tests/ without),
# mypy over the package and tools/; both pinned in tests/requirements.txt. Part of `test` and `check`.
# mypy runs even when ruff finds something, so that one run shows every finding; either fails it.
lint: $(VENV)/.ready
	$(VENV)/bin/ruff check .; ruff=$$?; $(VENV)/bin/mypy && exit $$ruff

# The aarch64 lane alone (part of `make test`): the scenarios run again in Debian trixie for arm64, its
# programs run by qemu-user-static through a binfmt_misc private to the test's user namespace.
aarch64: $(VENV)/.ready
	$(VENV)/bin/python tools/prereqs.py aarch64
	TMS_TEST_STRICT=1 nice -n 10 $(VENV)/bin/python -m pytest -q -rs -m aarch64

$(VENV)/.ready: tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	touch $@

# The main job: both crashes of a preload picked by file name (slime #2186 and its mirror on CUDA 12),
# then the flag fixing them, side by side, in a sandbox (.demo/).
demo:
	$(PYTHON) tools/demo.py

demo-clean:
	$(PYTHON) tools/demo.py --clean

# Start-up cost table (docs/performance.md); builds its venvs under ~/.cache/tms-autopreload-tests/bench.
bench:
	$(PYTHON) tools/bench.py

# The long fuzz run (docs/guarantees.md): 100,000 inputs per parser and per property of the variables
# a user sets, and 200 flagged starts of generated environments in real interpreters.
fuzz: $(VENV)/.ready
	TMS_TEST_STRICT=1 TMS_FUZZ_EXAMPLES=100000 TMS_FUZZ_E2E=200 $(VENV)/bin/python -m pytest -q \
		-W ignore::hypothesis.errors.HypothesisWarning tests/test_fuzz.py tests/test_inputs.py

# How many hand-made bugs of the decision core the suite catches (docs/development.md): each patch of
# tests/mutants/ applied to a scratch copy of the tree, and the test files it names run there as `check`
# runs them. Slow (a pytest session per mutant), so not part of `test`. MUTANTS_ARGS passes options:
# `make mutants MUTANTS_ARGS="--tests-from main -j 2"`, `--only ldcache`.
mutants: $(VENV)/.ready
	$(VENV)/bin/python tools/mutants.py $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
