# The two set-up commands of the README: `make run` and `make test`.
# TORCH picks the torch build. The default pin installs the CPU wheel that this kind of
# machine keeps on disk; on a GPU machine pip resolves the same pin to PyPI's CUDA build.
# To keep a torch you already have, install into an environment that has it:
#   make run VENV=/path/to/env TORCH=
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.opsynth-installed

.PHONY: install run test bench clean

$(STAMP): pyproject.toml Makefile
	@ldconfig -p | grep -q 'libseccomp\.so\.2' || { echo "opsynth's sandbox needs libseccomp: apt-get install libseccomp2 (or your distribution's libseccomp package)" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/opsynth run --config demo $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache
