# shift: the two commands a user needs are `make demo` and `make test`; both do their own set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup system-deps test test-unit test-rxe demo lint proto bench install clean

setup: $(STAMP) system-deps

# the C core is compiled by the package build: a change to its sources installs (and so builds) again
CORE_SOURCES := setup.py $(wildcard libshift/core/*.c libshift/core/*.h libshift/core/*.pyx libshift/core/*.pxd libshift/core/*.pxi)

# the system's packages first: pip compiles the core with gcc against rdma-core's verbs.h
$(STAMP): pyproject.toml $(CORE_SOURCES)
	@bash scripts/ensure-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'torch==2.13.0'
	$(PY) -m pip install --quiet -e '.[test,torch,plot]'
	touch $(STAMP)

system-deps:
	@bash scripts/ensure-system-deps.sh $(VENV)

# the host's suite and the whole of test-rxe side by side (scripts/test.sh says why); either failing fails it
test: setup
	@VENV=$(VENV) bash scripts/test.sh

test-unit: $(STAMP)
	$(PY) -m pytest -q -m "not lab"

# The verbs provider on real verbs, in a VM with Soft-RoCE devices (shiftlab/rxe): its tests, the
# conformance suite (one side on rxe0, the other on rxe1, link faults on), the failover cases with etcd
# and shiftd in the guest (test_rxe.py), and in a second VM without the runner's devices the rxe lab
# (test_lab_rxe.py: `shift-lab up --provider rxe` makes its own). Under TCG every test runs about
# ten times slower: 600 s a test, and the bulk transfer is 128 MiB, not the host's 1 GiB (160-210 s there).
# make test runs all of it beside the host's suite (docs/hardware.md has the times).
VERBS_TEST_BINARY := $(abspath build/rxe/test_verbs)
RXE_ENV := -e SHIFT_TEST_PROVIDER=verbs -e SHIFT_TEST_VERBS_DEVICES=rxe0,rxe1 -e SHIFT_TEST_VERBS_BREAK_LINK=1 \
	-e SHIFT_TEST_BULK_MIB=128 -e SHIFT_TEST_VERBS_BINARY=$(VERBS_TEST_BINARY)
RXE_TESTS ?= tests/core/test_verbs_c.py tests/core/test_verbs_face.py tests/providers/test_verbs_provider.py \
	tests/conformance tests/failover/test_rxe.py
RXE_LAB_TESTS ?= tests/shiftlab/test_lab_rxe.py
test-rxe: setup
	$(PY) tests/core/native_build.py $(VERBS_TEST_BINARY)
	$(PY) -m shiftlab.rxe run --timeout 2400 $(RXE_ENV) -- \
		$(abspath $(PY)) -m pytest -q -p no:cacheprovider --timeout 600 $(RXE_TESTS)
	$(if $(RXE_LAB_TESTS),$(PY) -m shiftlab.rxe run --timeout 1800 --no-setup -- \
		$(abspath $(PY)) -m pytest -q -p no:cacheprovider --timeout 600 $(RXE_LAB_TESTS))

demo: setup
	bash scripts/demo.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

proto: $(STAMP)
	$(PY) scripts/genproto.py

# the tables of the issue notes; bench/soak.py (10 min) and bench/many_qp_failover.py run on their own
bench: setup
	$(PY) bench/nic_event_latency.py
	$(PY) bench/perf_tcp_provider.py
	$(PY) bench/failover_downtime.py
	$(PY) bench/blackhole_detection.py
	$(PY) bench/shift_overhead.py
	$(PY) bench/collectives_bw.py
	$(PY) bench/gpt2_step_time.py

install:
	bash scripts/install.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache libshift/core/_core.c libshift/core/*.so
