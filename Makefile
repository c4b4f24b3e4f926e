# eaglelab: the two set-up commands of the README, and what they depend on.
PY ?= python3
PROMPT ?= Give three tips for staying healthy.

.PHONY: install run test bench bench-full

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

# The headline in a few minutes: plain and speculative decoding as `run` decodes here, and HF; batch 1 and 8 on
# CUDA (1 on a CPU). bench-full sweeps every configuration at every batch size.
bench: install
	$(PY) -m eaglelab bench

bench-full: install
	$(PY) -m eaglelab bench --full
