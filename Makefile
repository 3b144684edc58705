# winml-recipes: every target sets up .venv first (a no-op when it is already there).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL     ?= sam3-tiny
DEVICE    ?=
PRECISION ?=
SOURCE    ?=
TARGET_ARGS := $(if $(DEVICE),--device $(DEVICE)) $(if $(PRECISION),--precision $(PRECISION)) \
               $(if $(SOURCE),--source $(SOURCE))

.PHONY: install build test test-slow golden schema lint bench clean tables docs-image

install: $(STAMP)

# torch goes first and pinned: it installs a local CPU wheel (a loose range pulls CUDA).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt torch
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[export,dev,qnn,openvino,datasets,ray]'
	touch $(STAMP)

build: install
	$(BIN)/winml-recipes build recipes/$(MODEL).yaml $(TARGET_ARGS)

test: install
	$(BIN)/python -m pytest -q

# Minutes-long full-size cases (sam3-mid), kept out of `make test` and CI.
test-slow: install
	$(BIN)/python -m pytest -q -m slow

golden: install
	WINML_GOLDEN_ALL=1 $(BIN)/python -m pytest -q tests/golden --force-regen || \
	  WINML_GOLDEN_ALL=1 $(BIN)/python -m pytest -q tests/golden

# Both copies: schemas/ for editors in this repo, the package's for everyone else.
schema: install
	$(BIN)/winml-recipes schema --write
	$(BIN)/winml-recipes schema --write --dir winml_recipes/data/schemas

lint: install
	$(BIN)/ruff check winml_recipes tests bench experiments
	$(BIN)/ruff format --check winml_recipes tests bench experiments

bench: install
	$(BIN)/python bench/run.py

clean:
	rm -rf build .pytest_cache

# The measured tables of docs/ from docs/results/*.json (tests/docs/test_tables.py checks them).
tables:
	$(PYTHON) bench/tables.py

# The README's picture: a sam3-tiny npu/w8a16 build, its `run` on a bundled photo.
docs-image: install
	$(BIN)/winml-recipes run recipes/sam3-tiny.yaml --device npu --precision w8a16 -o build/docs-run
	$(BIN)/python -c "import pathlib, shutil; shutil.copy(next(pathlib.Path('build/docs-run').glob('*.png')), 'docs/images/run-sam3-tiny.png')"
