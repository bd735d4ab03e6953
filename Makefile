# Two commands do all the set-up on a fresh machine:
#   make demo   - the main job on the embedded tiny preset (creates .venv, runs `h3eval demo`)
#   make test   - the test suite (creates .venv, installs Debian's chromium for the browser test when root)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

system-deps:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || { echo "could not install Debian's chromium (needed by the dashboard browser test)"; exit 1; }; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the dashboard browser test"; exit 1; fi; \
	fi

demo: $(STAMP)
	$(BIN)/h3eval demo --out demo-run

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -rs

clean:
	rm -rf $(VENV) demo-run
