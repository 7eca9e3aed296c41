# Recipes mirror the README Quickstart; each one does its own setup.

default:
    @just --list

setup:
    scripts/setup --dev

# Quickstart line 1: the end-to-end demo on CPU
demo dir="demo-run":
    scripts/setup && .venv/bin/longctx demo --dir {{dir}}

# The inner loop: every package's tests except those that start processes or train (found by the
# collection hook in tests/fixtures/processes.py), slow and Slurm tests; a few minutes
test *args:
    scripts/setup --dev && .venv/bin/python -m pytest --inner-loop --durations=10 {{args}}

# Quickstart line 2: the whole test suite, as CI runs it
test-all *args:
    scripts/setup --dev && .venv/bin/python -m pytest {{args}}

lint:
    scripts/setup --dev && .venv/bin/ruff check longctx tests scripts && .venv/bin/ruff format --check longctx tests

bench what="all":
    scripts/setup && .venv/bin/longctx bench {{what}}

slurm-up:
    scripts/slurm/local-cluster up

slurm-down:
    scripts/slurm/local-cluster down
