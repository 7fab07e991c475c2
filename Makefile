# Two entry points: `make demo` runs the whole product on an embedded default, `make test` runs every check.
# Each builds its own virtual environment from scratch when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint typecheck unit crds protos bench image clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,demo]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/nodefabric demo

test: $(BIN)/.installed lint typecheck unit

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(BIN)/.installed
	$(BIN)/mypy devicemanager/nodefabric_devicemanager deviceplugin/nodefabric_deviceplugin operator/nodefabric_operator

# The suite runs on parallel workers (pytest-xdist): two per core, at most 8, since much of its time is
# spent waiting (timeouts, leases, subprocess start-ups) rather than computing; `make unit PYTEST_WORKERS=0`
# runs it in one process. A module whose tests must share one worker (an expensive module fixture) carries
# an xdist_group mark, which --dist loadgroup honours.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(8, 2 * len(os.sched_getaffinity(0))))' 2>/dev/null || echo auto)

unit: $(BIN)/.installed
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

crds: $(BIN)/.installed
	$(BIN)/python hack/gen_crds.py

protos: $(BIN)/.installed
	$(BIN)/python hack/gen_protos.py

bench: $(BIN)/.installed
	$(BIN)/python hack/bench_inventory.py
	$(BIN)/python hack/bench_walk.py
	$(BIN)/python hack/bench_pick.py
	$(BIN)/python hack/bench_deviceplugin.py
	$(BIN)/python hack/bench_extender.py
	$(BIN)/python hack/bench_admission.py
	$(BIN)/python hack/bench_dra.py
	$(BIN)/python hack/bench_agent.py
	$(BIN)/python hack/bench_operator.py
	$(BIN)/python hack/bench_operator.py --versus 500,2000,5000
	$(BIN)/python hack/bench_kubeapi.py
	$(BIN)/python hack/bench_topology.py

# The image every component runs, tagged as the chart's default (image.registry/repository:appVersion).
# Needs Docker with BuildKit. For both architectures and a registry:
#   make image DOCKER_BUILD="docker buildx build --platform linux/amd64,linux/arm64 --push" IMAGE=...
VERSION      := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE        ?= ghcr.io/gpustack/nodefabric:$(VERSION)
DOCKER_BUILD ?= docker build

image:
	$(DOCKER_BUILD) --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
