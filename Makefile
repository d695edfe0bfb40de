# Two entry points for a fresh machine: `make up` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
REGION  ?= r1
# REGIONS=r1,r2,r3: `make up` brings up each region's processes and Prometheus (and a global
# Prometheus over them) and gives each region the example demand.
REGIONS ?= $(REGION)
# PROFILE=secure: the box runs its own TLS-only PostgreSQL (:5433), NATS (:4223), Temporal
# behind nginx's mutual TLS (:7234) and Kafka behind nginx's mutual TLS (:19092, tansu on
# loopback :19093), each process with a certificate of the box's CA; the
# `sco` commands below then use the operator's settings file the box writes (SCO_CONFIG).
PROFILE ?= default
ifeq ($(PROFILE),secure)
AS_OPERATOR = SCO_CONFIG=$(CURDIR)/.sco/secure/settings/operator-$$r.toml
endif
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# CLOUD=simulator (default): the simulated cloud service. CLOUD=testcloud: the real
# OpenStack test cloud (`make testcloud-up` first) through openstacksdk.
CLOUD   ?= simulator
# The whole suite runs against the real OpenStack test cloud too: `make test` brings it up
# beside the other tests (~3.5 min from a fresh clone, ~5 s when up; `make testcloud-down`
# stops it) and its
# tests must run. TESTCLOUD=0 leaves it out (its tests then skip, said once).
TESTCLOUD ?= 1
ifeq ($(TESTCLOUD),1)
export SCO_REQUIRE_TESTCLOUD := 1
endif
ifeq ($(CLOUD),testcloud)
export SCO_PROVIDER__KIND := openstack
export SCO_PROVIDER__IMAGE := sco-image
export OS_CLIENT_CONFIG_FILE := $(CURDIR)/.sco/testcloud/clouds.yaml
endif

.PHONY: up down status deps test check test-under-load lint bench chaos estate-readme docs clean testcloud-up testcloud-down testcloud-test lock wheel image image-test

# pipefail: the install's progress goes through a filter, its exit status must not.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

$(STAMP): pyproject.toml
	@echo "sco: Python packages into $(VENV) (~1.5 min on a fresh machine, once)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[local,dev]' \
	    | sed -un -e 's/^Collecting \([^ ]*\).*/  collecting \1/p' -e 's/^Successfully installed.*/  installed/p'
	rm -f $(VENV)/.installed-* && touch $@

## Bring up the region in a box, the region's worker, relay and ledger consumer; run the
## region's first job (its pool catalogue through Temporal into fleet state), then give
## three example contracts demand: the controllers start acquisitions against the local
## provider, listed here and in the Temporal UI.
up: $(STAMP)
	SCO_REGION=$(REGION) $(BIN)/sco dev up --workers --regions $(REGIONS) --profile $(PROFILE)
	@for r in $$(echo $(REGIONS) | tr , ' '); do \
	    $(AS_OPERATOR) SCO_REGION=$$r $(BIN)/sco pools sync --region $$r && \
	    { [ $$r = r3 ] || $(AS_OPERATOR) SCO_REGION=$$r $(BIN)/sco demand set spark-etl 120 --region $$r; } && \
	    $(AS_OPERATOR) SCO_REGION=$$r $(BIN)/sco demand set ci-runners 200 --region $$r && \
	    $(AS_OPERATOR) SCO_REGION=$$r $(BIN)/sco demand set search-api 40 --region $$r || exit 1; \
	done
	@sleep 3; for r in $$(echo $(REGIONS) | tr , ' '); do \
	    $(AS_OPERATOR) SCO_REGION=$$r $(BIN)/sco acquisitions list --all --region $$r; done
	@[ $(PROFILE) != secure ] || echo "Secure profile: no Temporal UI; sco needs export SCO_CONFIG=$(CURDIR)/.sco/secure/settings/operator-$(REGION).toml"
	@[ $(PROFILE) = secure ] || echo "Temporal UI: http://127.0.0.1:8233/namespaces/$(REGION)/workflows?query=WorkflowType%3D%22AcquisitionWorkflow%22"
	@echo "Prometheus:  http://127.0.0.1:9090/alerts (region $(REGION); with REGIONS=r1,r2,r3 r2 is :9091, r3 :9092, the global query :9089)"

down: $(STAMP)
	$(BIN)/sco dev down

status: $(STAMP)
	$(BIN)/sco dev status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## What the tests need beyond the venv (tests/support/tools.py): Slurm, munge and Lua 5.1
## with apt-get when root, the CPU torch wheel into the venv. Idempotent, well under a
## second when all is there; what it cannot install it lists once, with the command and
## the tests that will skip (a failure only under SCO_REQUIRE_TOOLS=1).
deps: $(STAMP)
	$(BIN)/python -m tests.support.install_tools

## The whole suite: the tools (deps), then lint, types, the image and the test cloud *beside*
## every test on the real services (tests/run_suite.sh: the test cloud's and podman's tests
## wait for theirs; the rest do not need them), in TEST_WORKERS pytest-xdist workers at once
## (tests/support/parallel.py: who must share a worker; the tests wait on I/O far more than
## on the 2 cores). It ends with the 25 slowest tests and each session fixture's set-up
## time; the JUnit XML is the bench report's suite row. pytest exit code 5 (nothing
## collected) fails loudly: a suite that ran nothing is broken.
TEST_WORKERS ?= 4
PYTEST_RUN := $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=25
test: deps
	PYTEST='$(PYTEST_RUN) --junitxml=.sco/test-results.xml -m "not chaos_slow"' \
	    TESTCLOUD=$(TESTCLOUD) tests/run_suite.sh

## The fast tier, for the edit-test loop (~2 min): ruff, mypy, and every test that needs no
## running service (not marked `services` by tests/support/parallel.py). The tests run in a
## network namespace of their own when unshare allows (root, or user namespaces): there no
## PostgreSQL, NATS or broker answers, so a test that needs one fails here instead of
## passing by luck on a developer's machine. SCO_FAST_TIER=1: the costly property tests
## draw a quarter of their examples (tests/support/fuzz.py); the suite draws them all.
CHECK_WORKERS ?= 2
NO_NETWORK := $(shell unshare -n true 2>/dev/null && echo "unshare -n" || (unshare -rn true 2>/dev/null && echo "unshare -rn"))
check: deps
	$(MAKE) --no-print-directory lint
	SCO_FAST_TIER=1 $(NO_NETWORK) $(if $(NO_NETWORK),bash -c 'ip link set lo up 2>/dev/null; exec "$$0" "$$@"') \
	    $(BIN)/pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) --durations=15 -m "not services"

## The suite twice in a row beside CPU hogs (CI's machine may be busy): run it before you
## stop. Any failure here is a race to find, not a test to retry. LOAD_HOGS busy loops.
LOAD_HOGS ?= 2
test-under-load: $(STAMP)
	@hogs=""; for i in $$(seq $(LOAD_HOGS)); do (while :; do :; done) & hogs="$$hogs $$!"; done; \
	trap "kill $$hogs 2>/dev/null" EXIT; \
	echo "sco: $(LOAD_HOGS) CPU hogs beside the suite (pids$$hogs)"; \
	for run in 1 2; do \
	    start=$$(date +%s); $(MAKE) --no-print-directory test || exit 1; \
	    echo "sco: run $$run under load passed in $$(( $$(date +%s) - start )) s"; \
	done

## Fault-injection cases on the real services (fleet-DB outage and Temporal unreachable
## under the notice relay, broker killed, restarted and frozen under the outbox relay and
## the ledger consumer, poison events, the region worker SIGKILLed mid-acquisition,
## mid-cancel and mid-hall-loss (and on the test cloud when it is up), Temporal's server
## killed and restarted, a NATS server restarted, a notice relay down past the duplicate
## window, the Patroni primary killed mid-acquisition): each prints its counts as JSON into
## .sco/chaos.jsonl, every count must be 0. The fast ones also run in `make test`; those
## marked chaos_slow (worker kills on the test cloud) only here.
chaos: deps
	rm -f .sco/chaos.jsonl; mkdir -p .sco
	SCO_CHAOS_REPORT=$(CURDIR)/.sco/chaos.jsonl $(BIN)/pytest -q -p no:cacheprovider -m chaos; \
	rc=$$?; cat .sco/chaos.jsonl 2>/dev/null; exit $$rc

## Every benchmark, one after another, into one report: bench/results/latest.{json,md},
## and the performance table of docs/evidence.md between its bench markers. Non-zero when a
## bench failed or a measurement did not happen (a missed target is a result, shown as missed).
bench: deps
	$(BIN)/python bench/run_all.py --readme docs/evidence.md

## The estate simulation in docs/estate/: one 30-day run of the calibrated generator (r1, seed 1:
## estate.json, table.md, figures), then the issue-34 evaluation (every policy on the frozen
## scenarios' paired windows, 95 % intervals, SCO against the best baseline: evaluation.json,
## evaluation.md, eval_*.png) whose table goes into docs/evidence.md. About 30 min on 2 cores.
estate-readme: $(STAMP)
	$(BIN)/sco sim estate --days 30 --seed 1 --region r1 --tenants 1 --out docs/estate
	$(BIN)/sco sim evaluate --out docs/estate --readme docs/evidence.md

## docs/reference.md: every command and settings key, generated from the code
## (workers/cli/reference.py; tests/test_docs_reference.py fails when it is stale).
docs: $(STAMP)
	$(BIN)/sco docs reference --out docs/reference.md

## The real OpenStack test cloud (deploy/testcloud/README.md): ~3.5 min on a fresh machine
## (pip ~1.5 min of it), ~35 s after testcloud-down, ~5 s when up; ~3.3 GiB while up.
testcloud-up: $(STAMP)
	SCO_PYTHON=$(CURDIR)/$(BIN)/python deploy/testcloud/up.sh

testcloud-down:
	deploy/testcloud/down.sh

testcloud-test: $(STAMP)
	SCO_REQUIRE_TESTCLOUD=1 $(BIN)/pytest -q -p no:cacheprovider -m testcloud

clean: down
	deploy/testcloud/down.sh --purge
	rm -rf .sco

## The locked dependency set of the image (uv pip compile, hashes; Python 3.11 = Debian 12's).
## Re-run after changing pyproject.toml's dependencies and commit requirements.lock.
lock:
	$(BIN)/python -m pip install --quiet uv && $(BIN)/uv pip compile pyproject.toml \
	    --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	    --annotation-style line --custom-compile-command "make lock" -o requirements.lock

## dist/sco-<version>-py3-none-any.whl: what the image installs, and the install artefact
## for a slurmctld host (deploy/slurm/README.md).
## flock: setuptools builds in ./build, so two builds at once (make image and a test's) collide.
wheel: $(STAMP)
	@mkdir -p .sco
	flock .sco/wheel.lock sh -c 'rm -rf build dist/sco-*.whl && $(BIN)/pip wheel --no-deps --quiet -w dist .'

## The SCO image with podman (deploy/image/README.md), tagged with the worker's build id
## (the package version, which SCO_WORKER__BUILD_ID defaults to). ~2 min, once cached ~10 s.
IMAGE_REPO ?= registry.sco.internal/sco/sco
BUILD_ID   ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
export CONTAINERS_CONF ?= $(CURDIR)/deploy/image/containers.conf
image: wheel
	deploy/image/base-image.sh
	podman build --network host --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt \
	    -f deploy/image/Containerfile -t $(IMAGE_REPO):$(BUILD_ID) .
	@echo "built $(IMAGE_REPO):$(BUILD_ID)"

## The image tests after a fresh build (`make test` runs them too when the image exists).
image-test: image
	$(BIN)/pytest -q -p no:cacheprovider tests/deploy/test_image.py
