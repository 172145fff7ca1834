#!/usr/bin/env bash
# The README's test command: pytest over tests/ with the .venv that scripts/setup_env.sh made.
# Without a GPU the tests run in parallel, one pytest-xdist worker per CPU core, each test sent
# to the next free worker: on 2 cores the suite took 982 s so, 1067 s with each file kept in
# one worker (--dist loadfile: its module fixtures made once, but the last files ran alone).
# With a GPU, one test at a time: two processes would each take most of a GPU's memory (XLA
# preallocates) and the multi-GPU tests need every GPU to themselves.
# Without a GPU the workers also share one persistent compilation cache for the run (a fresh
# directory, removed at the end; tests/conftest.py turns it on): a program several tests compile
# alike is compiled once (the whole suite on 2 cores: 923 s, 1035 s without; session 53). Not
# with a GPU, where it was not measured.
# Env: JAX_FLASHOVERLAP_TEST_WORKERS (a count >= 0; unset: the CPU count without a GPU, 0
# with one; 0 or 1: no workers), JAX_FLASHOVERLAP_TEST_CACHE_DIR (set: that directory, kept;
# set empty: no cache), VENV (default .venv). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_gpus.sh
PY="${VENV:-.venv}/bin/python"

gpus="$(gpu_count)"
workers="${JAX_FLASHOVERLAP_TEST_WORKERS:-}"
if [ -z "$workers" ]; then
  if [ "$gpus" -gt 0 ]; then
    workers=0
  else
    workers="$(nproc 2>/dev/null || echo 1)"
  fi
elif ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "run_tests: JAX_FLASHOVERLAP_TEST_WORKERS=$workers must be a count >= 0" >&2
  exit 2
fi

given="${JAX_FLASHOVERLAP_TEST_CACHE_DIR:-}"
if [ -n "$given" ] && [ -e "$given" ] && [ ! -d "$given" ]; then
  echo "run_tests: JAX_FLASHOVERLAP_TEST_CACHE_DIR=$given is not a directory" >&2
  exit 2
fi
if [ "$gpus" -eq 0 ] && [ -z "${JAX_FLASHOVERLAP_TEST_CACHE_DIR+set}" ]; then
  cache_dir="$(mktemp -d "${TMPDIR:-/tmp}/jax_flashoverlap_tests.XXXXXX")"
  trap 'rm -rf "$cache_dir"' EXIT
  export JAX_FLASHOVERLAP_TEST_CACHE_DIR="$cache_dir"
fi

# Not exec: the trap removes the cache when pytest ends (set -e: its exit status is ours).
if [ "$workers" -gt 1 ]; then
  if "$PY" -c "import xdist" >/dev/null 2>&1; then
    "$PY" -m pytest -q -n "$workers" "$@"
    exit
  fi
  echo "run_tests: pytest-xdist is not installed: running the tests one at a time" >&2
fi
"$PY" -m pytest -q "$@"
