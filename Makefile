# Every target sets up what it needs from the package index; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv-test

.PHONY: test check lint aarch64 dist demo demo-clean bench fuzz mutants clean

# The test command (CI runs it through .ci/run): a venv with the test tools (uv among them, which
# finds or installs interpreters); the lint; what the machine must have, checked before any test and
# said in one message; then the whole suite.
# TMS_TEST_STRICT=1 turns every skip into a failure (but the GPU check's on a machine without a GPU):
# green means every scenario ran.
test: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py test
	TMS_TEST_STRICT=1 $(PYTEST) $(PYTEST_ARGS)

# The fast lane for the edit loop: every test not marked slow (slow: real torch or Ray, other
# interpreters, root file systems, builds from the package index; see tests/conftest.py), after the lint.
check: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py check
	TMS_TEST_STRICT=1 $(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The lanes run their tests on JOBS pytest-xdist workers, by default one more than the CPUs this process may
# use (its affinity, capped by its cgroup's CPU quota: tools/workers.py): the suite spends part of its time
# waiting on the processes it starts (Ray's daemons, pip, the loader's children). Each test module's tests go to one worker (`--dist loadscope`), so that the scenarios and
# clusters a module shares are made once. PYTEST_ARGS goes to pytest after the lane's own options:
# `make check JOBS=0 PYTEST_ARGS="-x --pdb tests/test_ldso.py"` runs one file in this one process, into
# the debugger at its first failure.
JOBS ?= $(shell $(PYTHON) tools/workers.py)
PYTEST = $(VENV)/bin/python -m pytest -q -rs -n $(JOBS) --dist loadscope

# ruff over everything (the rules in pyproject.toml: the package and tools/ annotated, tests/ without),
# mypy over the package and tools/, and the GitHub workflows against GitHub's schema (check-jsonschema's
# copy, offline) and by zizmor (offline audits: actions pinned by commit, permissions, injection); all
# pinned in tests/requirements.txt. Part of `test` and `check`. Each runs even when one before it finds
# something, so that one run shows every finding; any finding fails it.
WORKFLOWS = .github/workflows
lint: $(VENV)/.ready
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows $(WORKFLOWS)/*.yml || status=1; \
	$(VENV)/bin/zizmor --offline --quiet $(WORKFLOWS) || status=1; \
	exit $$status

# The aarch64 lane alone (part of `make test`): the scenarios run again in Debian trixie for arm64, its
# programs run by qemu-user-static through a binfmt_misc private to the test's user namespace.
aarch64: $(VENV)/.ready
	$(VENV)/bin/python tools/prereqs.py aarch64
	TMS_TEST_STRICT=1 nice -n 10 $(PYTEST) -m aarch64 $(PYTEST_ARGS)

# The sdist and the wheel built from it, in dist/ (tools/dist.py): the same bytes on every build of the same
# source and SOURCE_DATE_EPOCH (the last commit's time unless set), checked with twine and
# check-wheel-contents. TAG, the release workflow's tag, must be v<version>.
dist: $(VENV)/.ready
	$(VENV)/bin/python tools/dist.py $(if $(TAG),--tag "$(TAG)")

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
