#!/usr/bin/env bash
# The README's test command: pytest over tests/ with the .venv that scripts/setup_env.sh made.
# Without a GPU the tests run in parallel, one pytest-xdist worker per CPU core, each test sent
# to the next free worker: on 2 cores the suite took 982 s so, 1067 s with each file kept in
# one worker (--dist loadfile: its module fixtures made once, but the last files ran alone).
# With a GPU, one test at a time: two processes would each take most of a GPU's memory (XLA
# preallocates) and the multi-GPU tests need every GPU to themselves.
# Env: JAX_FLASHOVERLAP_TEST_WORKERS (a count >= 0; unset: the CPU count without a GPU, 0
# with one; 0 or 1: no workers), VENV (default .venv). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_gpus.sh
PY="${VENV:-.venv}/bin/python"

workers="${JAX_FLASHOVERLAP_TEST_WORKERS:-}"
if [ -z "$workers" ]; then
  if [ "$(gpu_count)" -gt 0 ]; then
    workers=0
  else
    workers="$(nproc 2>/dev/null || echo 1)"
  fi
elif ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "run_tests: JAX_FLASHOVERLAP_TEST_WORKERS=$workers must be a count >= 0" >&2
  exit 2
fi

if [ "$workers" -gt 1 ]; then
  if "$PY" -c "import xdist" >/dev/null 2>&1; then
    exec "$PY" -m pytest -q -n "$workers" "$@"
  fi
  echo "run_tests: pytest-xdist is not installed: running the tests one at a time" >&2
fi
exec "$PY" -m pytest -q "$@"
