# eaglelab: the two set-up commands of the README, and what they depend on.
PY ?= python3
PROMPT ?= Give three tips for staying healthy.

.PHONY: install run test bench

# torch is yours to bring (CPU, CUDA, ROCm). Only when none is installed do we install one:
# torch==2.13.0 (a CPU build where the platform ships one locally, else PyPI's default build).
install:
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test]"

# The main job on the embedded default: SmolLM2-135M-Instruct with the drafter we ship.
run: install
	$(PY) -m eaglelab run "$(PROMPT)"

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m eaglelab bench
