# Every target sets up what it needs from the package index; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv-test

.PHONY: test check except-coverage lint aarch64 dist demo demo-clean bench fuzz mutants mutants-patches clean

# The test command (CI runs it through .ci/run): a venv with the test tools (uv among them, which
# finds or installs interpreters); the lint; what the machine must have, checked before any test and
# said in one message; then the whole suite.
# TMS_TEST_STRICT=1 turns every skip into a failure (but the GPU check's on a machine without a GPU):
# green means every scenario ran.
# The fast lane runs first and measured (see except-coverage, whose check it ends with), then the rest.
test: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py test
	$(MEASURED_LANE)
	TMS_TEST_STRICT=1 $(PYTEST) -m "slow or unmeasured" $(PYTEST_ARGS) $(NONE_SELECTED)

# The fast lane for the edit loop: every test not marked slow (slow: real torch or Ray, other
# interpreters, root file systems, builds from the package index; see tests/conftest.py), after the lint.
check: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py check
	TMS_TEST_STRICT=1 $(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The fast lane measured by coverage.py in every interpreter its tests start (tests/except_coverage.py: a .pth
# in each venv the suite installs the package into), then every `except` of the package that no test reached
# named, but for the written list of those no test can reach. Part of `test`; about three times the fast
# lane's CPU time. With PYTEST_ARGS (a narrowed run) it reports what those tests reach and fails on nothing.
EXCEPT_DATA = $(CURDIR)/build/except-coverage
define MEASURED_LANE
$(VENV)/bin/python tests/except_coverage.py setup $(EXCEPT_DATA)
	TMS_TEST_STRICT=1 TMS_TEST_COVERAGE=$(EXCEPT_DATA) COVERAGE_PROCESS_START=$(EXCEPT_DATA)/coverage.ini \
		$(PYTEST) -m "not slow and not unmeasured" $(PYTEST_ARGS) $(NONE_SELECTED)
	$(VENV)/bin/python tests/except_coverage.py $(if $(PYTEST_ARGS),report,check) $(EXCEPT_DATA)
endef
# A narrowed run (PYTEST_ARGS) may select no test in one of the two runs of `test`: pytest's exit 5 is no failure.
NONE_SELECTED = $(if $(PYTEST_ARGS),|| [ $$? -eq 5 ])

except-coverage: $(VENV)/.ready lint
	$(VENV)/bin/python tools/prereqs.py check
	$(MEASURED_LANE)

# The lanes run their tests on JOBS pytest-xdist workers, by default one more than the CPUs this process may
# use (its affinity, capped by its cgroup's CPU quota: tools/workers.py): the suite spends part of its time
# waiting on the processes it starts (Ray's daemons, pip, the loader's children). Each test module's tests go to one worker (`--dist loadscope`), so that the scenarios and
# clusters a module shares are made once. PYTEST_ARGS goes to pytest after the lane's own options:
# `make check JOBS=0 PYTEST_ARGS="-x --pdb tests/test_ldso.py"` runs one file in this one process, into
# the debugger at its first failure.
# pytest keeps the test modules it rewrites (its assertion messages) as bytecode beside them, in __pycache__
# (ignored by git), unless PYTHONDONTWRITEBYTECODE is set, as some machines set it for every process: then
# each worker of each run rewrites every test module again (about 3 CPU-seconds a worker). The lanes unset it for
# pytest itself; the processes the tests start get an environment of the test's own making either way.
JOBS ?= $(shell $(PYTHON) tools/workers.py)
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -rs -n $(JOBS) --dist loadscope --no-loadscope-reorder

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
# a user sets, 200 flagged starts of generated environments in real interpreters, 100 generated worlds
# whose flagged start and commands must agree, and 600 generated library trees where the loader model must
# find every name where the real loader maps it (each ten times the fast lane's, drawn at random).
fuzz: $(VENV)/.ready
	TMS_TEST_STRICT=1 TMS_FUZZ_EXAMPLES=100000 TMS_FUZZ_E2E=200 TMS_FUZZ_WORLDS=100 TMS_FUZZ_LOADER=600 \
		$(VENV)/bin/python -m pytest -q -W ignore::hypothesis.errors.HypothesisWarning \
		tests/test_fuzz.py tests/test_inputs.py tests/test_outcomes.py tests/test_ldso_property.py

# How many bugs the suite catches (docs/development.md): each mutant applied to a scratch copy of the tree,
# and its module's test files run there as `check` runs them. `make mutants` runs cosmic-ray's generated
# mutants (tools/generated_mutants.py), a sample in an order fixed by MUTANTS_SEED, starting none after
# MUTANTS_BUDGET minutes; `make mutants-patches` the hand-made ones of tests/mutants/. Slow (a pytest
# session per mutant), so not part of `test`. MUTANTS_ARGS passes options: `make mutants
# MUTANTS_ARGS="--since main"` (the mutants of lines changed since main), `--then-full`;
# `make mutants-patches MUTANTS_ARGS="--tests-from main"`, `--only ldcache`.
MUTANTS_VENV ?= .venv-mutants
MUTANTS_SEED ?= 2026
MUTANTS_BUDGET ?= 30
# What tools/prereqs.py checks first: the fast lane's needs (`test` with --then-full or --lane test).
MUTANTS_NEEDS ?= check
mutants: $(VENV)/.ready $(MUTANTS_VENV)/.ready
	$(VENV)/bin/python tools/prereqs.py $(MUTANTS_NEEDS)
	$(VENV)/bin/python tools/mutants.py --generated --cosmic-ray $(MUTANTS_VENV)/bin/cosmic-ray \
		--sample 100000 --seed $(MUTANTS_SEED) --budget $(MUTANTS_BUDGET) -j $(JOBS) $(MUTANTS_ARGS)

mutants-patches: $(VENV)/.ready
	$(VENV)/bin/python tools/prereqs.py check
	$(VENV)/bin/python tools/mutants.py -j $(JOBS) $(MUTANTS_ARGS)

# cosmic-ray in a venv of its own: nothing of it reaches the test venv.
$(MUTANTS_VENV)/.ready: tests/mutants-requirements.txt
	$(PYTHON) -m venv $(MUTANTS_VENV)
	$(MUTANTS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r tests/mutants-requirements.txt
	touch $@

clean:
	rm -rf $(VENV) $(MUTANTS_VENV) build dist *.egg-info
