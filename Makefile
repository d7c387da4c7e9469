# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BCRIT  := $(VENV)/bin/bcrit
STAMP  := $(VENV)/.installed

.PHONY: install demo demo-figure test test-heavy test-kernels test-all lint bench bench-gpu clean mutate cluster-up cluster-local

# torch first, pinned to the local CPU wheel: an unpinned torch pulls a multi-GB CUDA build. On a GPU machine:
# `make install TORCH_INDEX=https://download.pytorch.org/whl/cu128` (the same torch version, built for CUDA).
# constraints.txt: the caps of this machine's package index (pyproject.toml keeps plain lower bounds).
TORCH_INDEX ?=
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

# The tiny sweep end to end (continued, not restarted, if runs/tiny already holds it), then the analysis.
# Its last lines are the answer, then the paths of report.html and of the figure (docs/demo-answer.png is a copy:
# `make demo-figure`). The sweep's own lines before them say where the tables and the MLflow store are.
demo: $(STAMP)
	@if [ -d runs/tiny/tune ]; then $(BCRIT) sweep examples/tiny.yaml --resume; else $(BCRIT) sweep examples/tiny.yaml; fi
	@$(BCRIT) analyze runs/tiny

# The README's figure, from the last `make demo`.
demo-figure:
	cp runs/tiny/analysis/answer.png docs/demo-answer.png

# Default suite: everything but @pytest.mark.slow and `heavy`. pytest's exit 5 (no tests collected) is a failure here.
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not heavy" -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The `heavy` tests (HEAVY in tests/conftest.py: coverage simulations, the demo spec's answer, the Ray fault tests,
# the longest Ray sweeps) that `make test` leaves out; CI runs both.
test-heavy: $(STAMP)
	$(PY) -m pytest -m "heavy and not slow" -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-heavy: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The `numerics` tests (floats compared after torch/numpy kernels) once more under other kernels than `make test`
# picked: ATen's portable code path (no AVX2/AVX-512/NEON), one intra-op thread, oneDNN off, MKL's BLAS held to
# SSE4.2 code (x86; ignored elsewhere), and numpy's runtime-dispatched SIMD loops off. A test that holds on one CPU's
# kernels only fails here (docs/testing.md).
KERNEL_ENV := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 BCRIT_TEST_THREADS=1 BCRIT_TEST_MKLDNN=0 \
	MKL_ENABLE_INSTRUCTIONS=SSE4_2
NPY_DISPATCH := from numpy._core._multiarray_umath import __cpu_features__ as f, __cpu_dispatch__ as d; \
	print(" ".join(x for x in d if f.get(x)))
PYTEST_FLAGS ?=
test-kernels: $(STAMP)
	NPY_DISABLE_CPU_FEATURES="$$($(PY) -c '$(NPY_DISPATCH)')" $(KERNEL_ENV) \
	$(PY) -m pytest -m "numerics and not slow" -q $(PYTEST_FLAGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-kernels: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-all: $(STAMP)
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 1; fi; exit $$rc

# On a GPU machine (the venv installed with TORCH_INDEX, above): every GPU figure of benchmarks/RESULTS.md, "GPU"
# (benchmarks/gpu_all.sh: the GPU tests, trial vs bare loop and GNS cost, compiled vs eager, a DiT-S/2 study) into
# GPU_OUT; GPU_PARTS picks parts. `bcrit analyze $(GPU_OUT)/study` reads the study's sweep directory.
GPU_OUT   ?= gpu-results
GPU_PARTS ?= tests bench compile study
bench-gpu: $(STAMP)
	PY=$(PY) OUT=$(GPU_OUT) PARTS="$(GPU_PARTS)" bash benchmarks/gpu_all.sh

# One command on one H100/H200, at most 8 minutes (benchmarks/gpu_proof.py): the GPU tests, the trial vs a bare loop
# and the GNS cost, a DiT-S/2 study of 16 trials run 4 at once on the GPU, and `bcrit analyze` of it, into GPU_OUT
# (proof.log ends with the GPU B_crit, its 90% interval and flags). Needs no venv and no install: the venv's python if
# there is one, else python3 (the lent device's image). GPU_PROOF_FLAGS: e.g. --smoke (the CPU rehearsal), --workers 2,
# --compile, --study-args '--lr-mults 0.5 1 2'.
GPU_PY          ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_PROOF_FLAGS ?=
.PHONY: gpu-proof
gpu-proof:
	$(GPU_PY) benchmarks/gpu_proof.py --out $(GPU_OUT) $(GPU_PROOF_FLAGS)

# Start the AWS cluster (docs/cluster.md): bcrit's offline check of the config first (Ray's validation, SSH only from
# your CIDR through your security group, MLflow and dashboard on loopback), then `ray up`. Needs AWS credentials and
# boto3. CLUSTER_FLAGS=--allow-world-ssh accepts SSH from the whole internet; RAY_UP_FLAGS=-y skips Ray's prompt.
CLUSTER       ?= cluster.yaml
CLUSTER_FLAGS ?=
RAY_UP_FLAGS  ?=
cluster-up: $(STAMP)
	$(BCRIT) check-cluster $(CLUSTER) $(CLUSTER_FLAGS)
	$(VENV)/bin/ray up $(CLUSTER) $(RAY_UP_FLAGS)

# Rehearse the cluster path on this machine (docs/cluster.md), no cloud account: a Ray head and two worker raylets
# (`ray start`, token auth), then `bcrit sweep` (2-worker DDP trials across the worker nodes), `analyze` and
# `recommend` with RAY_ADDRESS set; prints the answer and where to browse MLflow, and stops every node it started
# (only those). CLUSTER_LOCAL_FLAGS: e.g. --port 6431 --workdir DIR.
CLUSTER_LOCAL_FLAGS ?=
cluster-local: $(STAMP)
	$(PY) -m orchestrator.features.rehearsal.rehearse $(CLUSTER_LOCAL_FLAGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Mutation testing (slow, not in CI; docs/testing.md): `make mutate`, or one module: `make mutate MUTATE='trainables.stopping.*'`.
# Results are cached in mutants/: a second run tests only new or changed mutants. `mutmut show NAME` shows one.
MUTATE      ?=
MUTATE_JOBS ?= 1
mutate: $(STAMP)
	@test -x $(VENV)/bin/mutmut || $(PY) -m pip install -q -c constraints.txt -e ".[test,mutate]"
	$(VENV)/bin/mutmut run --max-children $(MUTATE_JOBS) $(MUTATE)
	$(PY) -m tests.mutation_scores

# Everything the demo, the tests, `make mutate`, `mlflow ui` and the linters write in the checkout (not the venv).
clean:
	rm -rf runs demo-runs mlruns mlartifacts mlflow.db .pytest_cache .ruff_cache mutants .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
