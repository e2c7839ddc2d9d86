# Two commands do everything:  `make demo` (the main job) and `make test` (every test, as CI runs it).
.PHONY: demo test lint unit proto setup clean
PY := .venv/bin/python

setup:
	@bash scripts/bootstrap.sh

demo: setup
	@$(PY) -m skiff_runtime demo

lint: setup
	@echo "==> ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
	@echo "==> mypy --strict"; .venv/bin/mypy
	@echo "==> import contracts"; .venv/bin/lint-imports

proto: setup
	@$(PY) scripts/gen_proto.py

test: setup lint
	@echo "==> pytest (runtime, operator, e2e)"; $(PY) -m pytest

clean:
	rm -rf .venv .cache .pytest_cache .mypy_cache .ruff_cache
