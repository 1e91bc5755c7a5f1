# The two commands of the README. Both set up .venv first (scripts/setup.sh).
.PHONY: setup test start bench

setup:
	@bash scripts/setup.sh

test: setup
	.venv/bin/python -m pytest -q

start: setup
	@bash scripts/start.sh

bench: setup
	.venv/bin/python benchmarks/allocator_speed.py
