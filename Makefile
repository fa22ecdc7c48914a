# The course's set-up in two commands: `make lab` runs the course, `make test` passes the tests.
#
# Variables (override on the command line, e.g. `make lab HOST=0.0.0.0 PORT=9000 BROWSER=0`):
#   COURSE_SIZE  ci | workshop (default: workshop when a GPU is visible, else ci)
#   HOST, PORT   where JupyterLab listens (default 127.0.0.1:8888, localhost only, with a token)
#   BROWSER      1 opens a browser tab, 0 does not (clusters, SSH tunnels, LUMI)
#   PYTHON       the interpreter that creates .venv (default python3)
#   VENV_ARGS    extra `python -m venv` arguments, e.g. --system-site-packages inside LUMI's PyTorch
#                container, so that the venv keeps the container's ROCm torch (jobs/lumi/setup_venv.sh)
#   PIP_ARGS     extra pip arguments, e.g. --no-deps when torch comes from elsewhere (jobs/lumi/setup_venv.sh)
#   OLDEST_VENV  the venv of `make test-oldest` (default .venv-oldest)

PYTHON ?= python3
VENV ?= .venv
HOST ?= 127.0.0.1
PORT ?= 8888
BROWSER ?= 1
VENV_ARGS ?=
PIP_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help setup data lab lint bytecode test test-quick oldest-venv test-oldest tensorboard figures screenshots clean

help:
	@echo "make lab          set up .venv, prepare the data for the active size, start JupyterLab"
	@echo "make test         set up .venv, prepare the ci data, run unit tests and every notebook"
	@echo "make test-quick   the same set-up, then only the unit tests not marked slow or distributed"
	@echo "make test-oldest  the tests marked oldest and notebook 00 on the oldest PyTorch (CI)"
	@echo "make lint         the linter (ruff, configured in pyproject.toml); make test runs it first"
	@echo "make setup        only create .venv and install the pinned packages and course_utils"
	@echo "make data         only prepare the data for the active size (COURSE_SIZE=ci|workshop)"
	@echo "make tensorboard  serve the runs' TensorBoard logs on 127.0.0.1:6006"
	@echo "make figures      draw the lessons' diagrams into img/ (course_utils.tooling.diagrams)"
	@echo "make screenshots  run notebooks 00-02 in Chromium and refresh the reference screenshots in img/screenshots/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install $(PIP_ARGS) -e '.[test]'
	touch $@

setup: $(STAMP)

data: setup
	$(BIN)/python -m data_prep

# JupyterLab's defaults for this course (no pop-up asking about Jupyter news over every notebook, no
# update check from a cluster node), in the place JupyterLab reads overrides from: the venv's settings.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): jupyter/overrides.json $(STAMP)
	mkdir -p $(dir $@)
	cp $< $@

# jupyter/jupyter_server_config.py saves the course's notebooks without outputs: the checkout stays clean. The venv's
# bin/ leads PATH, as after `source .venv/bin/activate`: `!python -m course_utils.doctor` in a cell and `python`
# in JupyterLab's terminal are the course's Python, not the system's (or none).
lab: data $(LAB_OVERRIDES)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --config=jupyter/jupyter_server_config.py --ip=$(HOST) --port=$(PORT) \
		$(if $(filter 0,$(BROWSER)),--no-browser,) $(if $(filter 0,$(shell id -u)),--allow-root,)

lint: setup
	$(BIN)/ruff check .

# The tests start many Python processes (torchrun ranks, the training command, notebook kernels): the
# package's bytecode compiled once spares each of them compiling it again where no cache is written.
bytecode: setup
	$(BIN)/python -m compileall -q src data_prep

# The suite on TEST_WORKERS pytest-xdist workers, each taking whole files, the longest first (conftest.py): many
# tests wait (time limits, hangs on purpose, Slurm's queue, the browser) while others use the cores.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: lint bytecode
	COURSE_SIZE=ci $(BIN)/python -m data_prep --size ci
	COURSE_SIZE=ci $(BIN)/python -m pytest $(XDIST)

# The unit tests that neither train for long nor start real processes (torchrun, the command, Slurm);
# no notebooks. A check while editing: `make test` stays the one that counts.
test-quick: lint
	COURSE_SIZE=ci $(BIN)/python -m data_prep --size ci
	COURSE_SIZE=ci $(BIN)/python -m pytest $(XDIST) -m "not slow and not distributed" tests

# The oldest PyTorch the course supports (src/course_utils/versions.py) in a venv of its own: what learners on LUMI's
# and NGC's containers run. Only what differs between the versions is installed there: torch and torchvision (with
# the libraries they bring); every other package is the pinned one of $(VENV), read from its site-packages after
# the venv's own (a path in a .pth file), so nothing the two share is downloaded or installed twice. It runs the tests
# marked `oldest` (pyproject.toml): one real-process test for each PyTorch API that changed between the oldest and
# the pin (gloo's teardown, torchrun's agent and restarts, DDP, FSDP2 and its sharded checkpoints, DTensor,
# exact resume's random states, autocast and torch.compile, the profiler's traces, saved-tensor hooks on the meta
# device, torchvision's detectors, the Flight Recorder and TORCH_DISTRIBUTED_DEBUG's messages, and the scripts the
# learners write in 07, 09 and 11, which call DDP, fully_shard, DTensor and pipelining themselves), and notebook 00,
# which says whether the running PyTorch is supported; the rest of the suite reaches those APIs through the same code.
OLDEST_VENV ?= .venv-oldest
OLDEST_NOTEBOOKS ?= notebooks/00_setup.ipynb
OLDEST_STAMP := $(OLDEST_VENV)/.installed
SITE_PACKAGES := import sysconfig; print(sysconfig.get_paths()["purelib"])
$(OLDEST_STAMP): pyproject.toml src/course_utils/versions.py | $(STAMP)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(BIN)/python -c '$(SITE_PACKAGES)' >"$$($(OLDEST_VENV)/bin/python -c '$(SITE_PACKAGES)')/course-pinned.pth"
	$(OLDEST_VENV)/bin/python -m pip install $$($(PYTHON) src/course_utils/versions.py oldest)
	$(OLDEST_VENV)/bin/python -m pip install --no-deps -e .
	touch $@

# Only the venv, for a run that prepares it beside other work (.ci/run builds it while `make test` runs).
oldest-venv: $(OLDEST_STAMP)

test-oldest: lint bytecode $(OLDEST_STAMP)
	COURSE_SIZE=ci $(OLDEST_VENV)/bin/python -m data_prep --size ci
	COURSE_SIZE=ci $(OLDEST_VENV)/bin/python -m pytest $(XDIST) -m oldest tests
	COURSE_SIZE=ci $(OLDEST_VENV)/bin/python -m pytest $(OLDEST_NOTEBOOKS)

tensorboard: setup
	$(BIN)/tensorboard --logdir $${COURSE_RUNS_DIR:-runs} --host 127.0.0.1 --port $${COURSE_TENSORBOARD_PORT:-6006}

# The diagrams the notebooks show, drawn by code so that a change to one is a change to its code.
figures: setup
	$(BIN)/python -m course_utils.tooling.diagrams img

# The browser test (Debian's chromium) run for its screenshots: img/screenshots/ gets one per notebook.
screenshots: setup
	COURSE_UPDATE_SCREENSHOTS=1 COURSE_SIZE=ci $(BIN)/python -m pytest tests/test_browser.py

clean:
	rm -rf runs .pytest_cache
