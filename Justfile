# Recipes mirror the README Quickstart; each one does its own setup.

default:
    @just --list

setup:
    scripts/setup --dev

# Quickstart line 1: the end-to-end demo on CPU
demo dir="demo-run":
    scripts/setup && .venv/bin/longctx demo --dir {{dir}}

# Quickstart line 2: the test suite
test *args:
    scripts/setup --dev && .venv/bin/python -m pytest {{args}}

lint:
    scripts/setup --dev && .venv/bin/ruff check longctx tests scripts && .venv/bin/ruff format --check longctx tests

bench what="all":
    scripts/setup && .venv/bin/longctx bench {{what}}

slurm-up:
    scripts/slurm/local-cluster up

slurm-down:
    scripts/slurm/local-cluster down
