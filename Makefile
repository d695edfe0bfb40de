# Two entry points for a fresh machine: `make up` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
REGION  ?= r1
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# CLOUD=simulator (default): the simulated cloud service. CLOUD=testcloud: the real
# OpenStack test cloud (`make testcloud-up` first) through openstacksdk.
CLOUD   ?= simulator
ifeq ($(CLOUD),testcloud)
export SCO_PROVIDER__KIND := openstack
export SCO_PROVIDER__IMAGE := sco-image
export OS_CLIENT_CONFIG_FILE := $(CURDIR)/.sco/testcloud/clouds.yaml
endif

.PHONY: up down status test lint unit bench clean testcloud-up testcloud-down testcloud-test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[local,dev]'
	rm -f $(VENV)/.installed-* && touch $@

## Bring up the region in a box, the region's worker, relay and ledger consumer; run the
## region's first job (its pool catalogue through Temporal into fleet state), then give
## three example contracts demand: the controllers start acquisitions against the local
## provider, listed here and in the Temporal UI.
up: $(STAMP)
	SCO_REGION=$(REGION) $(BIN)/sco dev up --workers
	SCO_REGION=$(REGION) $(BIN)/sco pools sync --region $(REGION)
	SCO_REGION=$(REGION) $(BIN)/sco demand set spark-etl 120 --region $(REGION)
	SCO_REGION=$(REGION) $(BIN)/sco demand set ci-runners 200 --region $(REGION)
	SCO_REGION=$(REGION) $(BIN)/sco demand set search-api 40 --region $(REGION)
	@sleep 3; SCO_REGION=$(REGION) $(BIN)/sco acquisitions list --all --region $(REGION)
	@echo "Temporal UI: http://127.0.0.1:8233/namespaces/$(REGION)/workflows?query=WorkflowType%3D%22AcquisitionWorkflow%22"

down: $(STAMP)
	$(BIN)/sco dev down

status: $(STAMP)
	$(BIN)/sco dev status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The whole suite: lint, types, then every test on the real services.
## pytest exit code 5 (nothing collected) fails loudly: a suite that ran nothing is broken.
test: lint
	$(BIN)/pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/outbox_bench.py
	$(BIN)/python bench/contracts_bench.py
	$(BIN)/python bench/simulator_bench.py
	$(BIN)/python bench/planner_bench.py
	$(BIN)/python bench/control_bench.py
	$(BIN)/python bench/floor_bench.py
	$(BIN)/python bench/floor_testcloud_bench.py
	$(BIN)/python bench/slurm_resume_bench.py

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
