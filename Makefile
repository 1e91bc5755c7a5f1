# The two commands of the README. Both set up .venv first (scripts/setup.sh).
.PHONY: setup test test-slow test-torch-ends start cli-demo bench bench-setup paper-runs zoo finetune-setup test-finetune zoo-finetune \
	unsloth-setup test-unsloth zoo-unsloth recordings-compiled

setup:
	@bash scripts/setup.sh

# The default run: every test but those marked slow, on two pytest workers, as every test
# target below but test-slow (a test file stays on one worker; each worker holds its own torch,
# about 1 GB of memory, so more of them are for machines with the memory and cores).
PYTEST_WORKERS ?= 2
WORKERS = -n $(PYTEST_WORKERS) --dist loadfile
test: setup
	.venv/bin/python -m pytest -q -m "not slow" $(WORKERS)

# The slow tests, one at a time (CI runs them after `test`): JupyterLab and Notebook 7 in
# Chromium, the demo notebooks executed whole, the advisor's searches made by hand, a 7B-sized
# step's memory, the ground-truth runner's dry run. Each is CPU-heavy and uses both cores.
test-slow: setup
	.venv/bin/python -m pytest -q -m slow

# The supported PyTorch range's two ends (README, "Install"): the engine's tests on each,
# with PyPI's default Linux wheel (a CUDA build, run here without a driver). CI runs it after `test`.
TORCH_OLDEST = 2.10.0
TORCH_NEWEST = 2.14.1
test-torch-ends:
	PYTEST_WORKERS=$(PYTEST_WORKERS) bash scripts/test_torch.sh $(TORCH_OLDEST)
	PYTEST_WORKERS=$(PYTEST_WORKERS) bash scripts/test_torch.sh $(TORCH_NEWEST)

# The one public GPU recording of a compiled step (kk memory_logs, benchmarks/recordings.py) was
# made with torch 2.6: Inductor's schedule is that release's, so it is traced under 2.6 (the
# recording's own torch, outside the supported range; benchmarks only, not CI).
TORCH_KK = 2.6.0
recordings-compiled:
	@test -x .venv-torch-$(TORCH_KK)/bin/python || python3 -m venv .venv-torch-$(TORCH_KK)
	.venv-torch-$(TORCH_KK)/bin/pip install --quiet --disable-pip-version-check "torch==$(TORCH_KK)" "triton==3.2.0" \
		"numpy>=1.24" "einops==0.8.2" "einx==0.4.3" "jaxtyping>=0.3" 2>&1 | grep -v "^WARNING: Location" || true
	PYTHONPATH="$$PWD" .venv-torch-$(TORCH_KK)/bin/python benchmarks/recordings.py --only memory_logs --show-diff 3

start: setup
	@bash scripts/start.sh

cli-demo: setup
	@bash scripts/cli_demo.sh

bench: setup
	.venv/bin/python benchmarks/allocator_speed.py

# Benchmarks that need torchvision / transformers get their own environment: torchvision
# needs torch 2.14.1 here (a large build), which the test environment does not need.
# transformers is pinned to the release the paper's GPU runs used (4.51): its models build
# their attention and loss differently from later releases, and paper_runs.py rebuilds those runs.
# peft, accelerate, timm and diffusers are for the zoo's scripts (benchmarks/zoo/), pinned to
# releases that go with that transformers and torch.
bench-setup:
	@test -x .venv-bench/bin/python || python3 -m venv .venv-bench
	.venv-bench/bin/pip install --quiet --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1" "transformers==4.51.3" \
		"peft==0.15.2" "accelerate==1.6.0" "timm==1.0.15" "diffusers==0.33.1" \
		"einops==0.8.2" "einx==0.4.3" "jaxtyping>=0.3"  # the CS336 model benchmarks/recordings/ rebuilds
	.venv-bench/bin/pip install --quiet --disable-pip-version-check -e .

# The ecosystem zoo (benchmarks/zoo/): every script estimated under an 8 GiB host-memory cap.
zoo: bench-setup
	.venv-bench/bin/python benchmarks/zoo.py --markdown

paper-runs: bench-setup
	.venv-bench/bin/python benchmarks/paper_runs.py

# The fine-tuning stack of 2026 (issue #31): transformers 5.x with peft, TRL, bitsandbytes,
# Liger's Triton kernels, Lightning and torchao, on PyPI's default Linux torch wheel (a CUDA
# build with Triton, run here without a driver). An environment of its own: the paper runs'
# environment (.venv-bench) stays on transformers 4.51.
FINETUNE_PINS = "torch==2.14.1" "transformers==5.25.0" "peft==0.21.2" "trl==1.16.0" "bitsandbytes==0.50.2" \
	"liger-kernel==0.8.5" "lightning==2.6.6" "torchao==0.18.0" "accelerate>=1.10" "datasets>=3.0" \
	"numpy>=1.24" "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "jsonschema>=4.0" "tqdm>=4.60" \
	"ipython>=8.0" "ipykernel>=6.0" "ipywidgets>=8.1" "bokeh>=3.4" "jupyter_bokeh>=4.0" "nbclient>=0.10" "nbformat>=5.9"
# It is also a Jupyter kernel, "Python (xmem fine-tuning stack)", for demo_notebooks/07 in `make start`'s JupyterLab.
finetune-setup:
	@test -x .venv-ft/bin/python || python3 -m venv .venv-ft
	.venv-ft/bin/pip install --quiet --disable-pip-version-check $(FINETUNE_PINS) 2>&1 | grep -v "^WARNING: Location" || true
	@if [ -x .venv/bin/python ]; then PYTHONPATH="$$PWD" .venv-ft/bin/python -m ipykernel install --prefix "$$PWD/.venv" \
		--name xmem-finetune --display-name "Python (xmem fine-tuning stack)" \
		--env PYTHONPATH "$$PWD" > /dev/null 2>&1; fi

# The fine-tuning stack's tests (they skip where a library is missing; here none is).
test-finetune: finetune-setup
	PYTHONPATH="$$PWD" .venv-ft/bin/python -m pytest -q -p no:cacheprovider $(WORKERS) tests/finetune tests/jupyter/test_compile_toggle.py
	@# the compile toggle in JupyterLab, in the kernel finetune-setup installs (skips without .venv's browser)
	if [ -x .venv/bin/python ]; then .venv/bin/python -m pytest -q -p no:cacheprovider tests/browser/test_browser_compile.py; fi

# The fine-tuning zoo (benchmarks/zoo/finetune/): every script estimated under an 8 GiB cap.
zoo-finetune: finetune-setup
	PYTHONPATH="$$PWD" .venv-ft/bin/python benchmarks/zoo.py --dir benchmarks/zoo/finetune --markdown

# Unsloth (issue #31) in an environment of its own: it pins transformers <= 5.17 and trl <= 1.15
# and patches them, peft and TRL when imported, so it cannot share .venv-ft. PyPI's default Linux
# torch wheel (a CUDA build, no driver here). Its test runs `xmem estimate` on Unsloth's QLoRA
# notebook in a child process; the check below keeps a failed install from passing as a skip.
UNSLOTH_PINS = "torch==2.14.1" "unsloth==2026.10.9" "unsloth_zoo==2026.10.9" "transformers==5.17.0" "trl==1.15.0" \
	"peft==0.21.2" "bitsandbytes==0.50.2" "datasets>=3.0" "pytest>=8" "pytest-xdist>=3.5" "numpy>=1.24" "tqdm>=4.60"
unsloth-setup:
	@test -x .venv-unsloth/bin/python || python3 -m venv .venv-unsloth
	.venv-unsloth/bin/pip install --quiet --disable-pip-version-check $(UNSLOTH_PINS) 2>&1 | grep -v "^WARNING: Location" || true
	@.venv-unsloth/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('unsloth') is None and 'unsloth did not install')"

test-unsloth: unsloth-setup
	PYTHONPATH="$$PWD" .venv-unsloth/bin/python -m pytest -q -p no:cacheprovider $(WORKERS) tests/unsloth_notebook

zoo-unsloth: unsloth-setup
	PYTHONPATH="$$PWD" .venv-unsloth/bin/python benchmarks/zoo.py --dir benchmarks/zoo/finetune --only unsloth_qlora unsloth_conversational unsloth_grpo --markdown
