# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
LISTEN ?= 127.0.0.1:8080
SIM_LISTEN ?= 127.0.0.1:8081
OBJECTS ?= 1000
NAMESPACES ?= 10
CHURN ?= 5
IMAGE ?= watchcache:0.1.0
OVERLAY ?= production
LOADTEST_PROFILE ?= steady
LOADTEST_ARGS ?= --users 20 --spawn-rate 10 --duration 30s

.PHONY: run sim test test-reference lint fmt clean proto deploy-test deploy-render image loadtest loadtest-ui bench bench-quick bench-restart bench-slow-readers chaos

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

## run: the simulated cluster and the watch cache in front of it (two processes)
run: $(BIN)/.installed
	$(BIN)/watchcache demo --listen $(LISTEN) --sim-listen $(SIM_LISTEN) --objects $(OBJECTS) --namespaces $(NAMESPACES) --churn $(CHURN)

## sim: the simulated cluster alone
sim: $(BIN)/.installed
	$(BIN)/watchcache sim --listen $(SIM_LISTEN) --objects $(OBJECTS) --namespaces $(NAMESPACES) --churn $(CHURN)

## test: the whole suite
# The suite starts ~300 proxy and simulator processes, each importing ~170 modules of watchcache. Where the
# environment sets PYTHONDONTWRITEBYTECODE (this workplace's does) none would be cached, and every start would
# compile them all anew: 0.9 s of CPU per import on a 2-core machine of session 40, 0.6 s from .pyc files.
# --dist worksteal: a worker that runs out of tests takes half of the other's queue. With xdist's default
# (load) the wall time was 90 s more than half the tests' summed durations (656 s for 1,131 s, session 46),
# the likeliest reading one worker idle while the other's queue still held long tests; with worksteal
# 30 s more (549 s for 1,038 s), in one run each with the kit.
# -n 3 on 2 cores: much of the suite's time is waiting (for processes to start, for kube-apiserver, for
# timeouts), not computing. With the kit, session 50: -n 2 took 602 and 616 s (1,210 s of summed durations);
# with the reference tier's Table comparisons no longer waiting on consistent reads (500a76f), 520 s, the
# machine's two cores idle half of it; -n 3, 404 s, idle 32% (/proc/stat over each run).
test: $(BIN)/.installed
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -n 3 --dist worksteal $(PYTEST_ARGS)

## test-reference: the tier against a real kube-apiserver and control plane (shared/tools/kube-reference; run
## `eval "$$(../shared/tools/kube-reference/env.sh)"` first, else it skips): prints the control-plane timing table
REFERENCE_TESTS ?= tests/reference
test-reference: $(BIN)/.installed
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -s -rs $(REFERENCE_TESTS) $(PYTEST_ARGS)

## lint: ruff (lint and format), mypy, and the import layering (import-linter contracts in pyproject.toml; docs/architecture.md)
lint: $(BIN)/.installed
	$(BIN)/ruff check watchcache harness tests loadtest
	$(BIN)/ruff format --check watchcache harness tests loadtest
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

fmt: $(BIN)/.installed
	$(BIN)/ruff check --fix watchcache harness tests loadtest
	$(BIN)/ruff format watchcache harness tests loadtest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

## proto: regenerate the protobuf modules with grpcio-tools' protoc (shard stream, kube wire; a test checks they match the .proto files)
proto: $(BIN)/.installed
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. watchcache/shard/follow.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. watchcache/kubeproto/meta.proto

## deploy-test: the deployment checks (kustomize renders, schemas, CLI flags, Dockerfile, alerts, dashboard)
deploy-test: $(BIN)/.installed
	$(BIN)/pytest -q tests/deploy

## deploy-render: print the manifests of an overlay (OVERLAY=dev|production), with the dev extra's kubectl
deploy-render: $(BIN)/.installed
	$(BIN)/kubectl kustomize deploy/kubernetes/overlays/$(OVERLAY)

## image: build the container image (needs a Docker engine with BuildKit)
image:
	DOCKER_BUILDKIT=1 docker build -f deploy/Dockerfile -t $(IMAGE) .

# LISTEN / SIM_LISTEN given on the command line (or in the environment) put the load test's stack on
# those ports, as `make run`; otherwise it takes free ports, so it never collides with a `make run`.
STACK_PORTS = $(if $(filter command line environment,$(origin LISTEN)),--listen $(LISTEN)) \
	$(if $(filter command line environment,$(origin SIM_LISTEN)),--sim-listen $(SIM_LISTEN))

## loadtest: a locust profile against a fresh `watchcache demo` stack (free ports, or LISTEN= SIM_LISTEN=); reports in loadtest/reports/
loadtest: $(BIN)/.installed
	$(BIN)/python -m loadtest.locust.run --start-stack $(STACK_PORTS) --profile $(LOADTEST_PROFILE) $(LOADTEST_ARGS)

## loadtest-ui: locust's web UI (http://127.0.0.1:8089) against a fresh stack; Ctrl-C stops both
loadtest-ui: $(BIN)/.installed
	$(BIN)/python -m loadtest.locust.run --start-stack $(STACK_PORTS) --ui --profile $(LOADTEST_PROFILE) $(LOADTEST_ARGS)

## bench-quick: the four hot-path benchmarks in quick mode (< 1 min each)
bench-quick: $(BIN)/.installed
	$(BIN)/python -m loadtest.bench.fanout --quick
	$(BIN)/python -m loadtest.bench.list --quick
	$(BIN)/python -m loadtest.bench.memory --quick
	$(BIN)/python -m loadtest.bench.upstream --quick

## bench: the four hot-path benchmarks in full (~20 min on 2 cores); results: docs/performance.md (every run: docs/lab/performance-notebook.md)
bench: $(BIN)/.installed
	$(BIN)/python -m loadtest.bench.fanout --profile
	$(BIN)/python -m loadtest.bench.list
	$(BIN)/python -m loadtest.bench.memory
	$(BIN)/python -m loadtest.bench.upstream

## bench-restart: what a restart costs 1,000 informers on 10,000 objects: the proxy vs the sim vs a kube-apiserver (docs/reliability.md)
bench-restart: $(BIN)/.installed
	$(BIN)/python -m loadtest.bench.restart

## bench-slow-readers: clients that ask for LISTs and never read them (HTTP/1.1, and HTTP/2 with closed windows) vs the others' answers (docs/security.md)
bench-slow-readers: $(BIN)/.installed
	$(BIN)/python -m loadtest.bench.slow_readers

## chaos: the reliability campaign: 5 min of faults around the proxy, every client's watch stream checked (docs/reliability.md)
chaos: $(BIN)/.installed
	$(BIN)/python -m loadtest.chaos.campaign --duration 300
