# The two commands a newcomer needs: `make demo` (the main job) and `make test` (the suite).
# Each builds the virtual environment in .venv on first use; later runs reuse it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint sweep bench bench-peers clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Cellar needs Python 3.11 or newer; set PYTHON=python3.11")'
	@$(PYTHON) -m venv $(VENV) || { echo "python venv failed: on Debian or Ubuntu run 'apt-get install python3-venv'"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cellar dev

# Two workers (pytest-xdist): the suite takes about 5 minutes on a 2-core machine, against 9 to
# 10 in one process. TEST_WORKERS=0 runs it in one process (pdb, or a test that needs the machine).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

bench-peers: $(STAMP)
	$(BIN)/cellar bench peers

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy .

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
