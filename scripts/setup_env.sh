#!/usr/bin/env bash
# Sets up .venv for jax_flashoverlap on a fresh machine and builds the package in place.
#   CPU machine: installs jax (CPU), the build deps and test deps from PyPI; builds the CUDA
#                extension too when nvcc is present (headers only; no GPU needed).
#   GPU machine: reuses the system's CUDA jax / NCCL (--system-site-packages); wheels in
#                .whl/ (e.g. nvidia-cutlass, carried to machines with no index) are used first.
# Env: PYTHON (default python3), JAX_FLASHOVERLAP_BUILD_CUDA (auto|1|0), VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_gpus.sh
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
  # If $PYTHON is itself a venv (e.g. the GPU machine's CUDA JAX lives in one), inherit its
  # packages too: --system-site-packages only reaches the base interpreter's.
  parent_sites="$("$PYTHON" -c 'import sys, sysconfig; print("\n".join(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})) if sys.prefix != sys.base_prefix else "")')"
  if [ -n "$parent_sites" ]; then
    site_dir="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$parent_sites" > "$site_dir/zz_parent_env.pth"
  fi
fi
PY="$VENV/bin/python"
# jax 0.10 (the floor) and jaxlib need Python 3.11 or newer and have no wheels for older ones:
# say so here rather than through pip's "no matching distribution found for jaxlib".
py_version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "${py_version%%.*}" -lt 3 ] || { [ "${py_version%%.*}" -eq 3 ] && [ "${py_version#*.}" -lt 11 ]; }; then
  echo "[setup_env] $VENV runs Python $py_version; jax_flashoverlap needs 3.11 or newer (as jax" \
       "0.10 and jaxlib do): remove $VENV and run again with PYTHON=python3.11 (or newer)" >&2
  exit 1
fi

have() { "$PY" -c "import $1" >/dev/null 2>&1; }
pip_install() {
  # Carried wheels first, without their dependencies (nvidia-cutlass is needed for its
  # headers only, and machines with no index cannot resolve the rest).
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    local pkg missing=()
    for pkg in "$@"; do
      "$PY" -m pip install -q --no-index --no-deps --find-links .whl "$pkg" >/dev/null 2>&1 \
        || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    set -- "${missing[@]}"
  fi
  "$PY" -m pip install -q "$@"
}

# JAX itself: where the driver lists GPUs, the CUDA build for the CUDA release the driver runs
# (plain `jax` is the CPU build: every op would run on the CPU with the GPUs idle);
# jax[cuda13] needs a CUDA 13 driver (580 or newer), jax[cuda12] a CUDA 12 one.
gpus_listed=$(gpu_count)
jax_cuda="" nccl_wheel=nvidia-nccl-cu13 cuda_major=""
if [ "$gpus_listed" -gt 0 ]; then
  cuda_major=$(driver_cuda_major)
  if [ "${cuda_major:-0}" -ge 13 ]; then
    jax_cuda=cuda13
  elif [ "${cuda_major:-0}" -eq 12 ]; then
    jax_cuda=cuda12 nccl_wheel=nvidia-nccl-cu12
  elif ! have jax; then
    echo "[setup_env] WARNING: nvidia-smi lists $gpus_listed GPU(s), but its driver runs CUDA" \
         "${cuda_major:-(not said)}; JAX's CUDA builds need a CUDA 12 or 13 driver: installing" \
         "the CPU build of jax" >&2
  fi
fi

need=()
have jax || need+=("jax${jax_cuda:+[$jax_cuda]}>=0.10")
have pytest || need+=(pytest)
have pybind11 || need+=(pybind11)
have flax || need+=(flax)
have matplotlib || need+=(matplotlib)
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('nvidia.nccl') is None)" 2>/dev/null \
  || need+=("$nccl_wheel")
have cutlass_library || need+=(nvidia-cutlass)
have setuptools || need+=(setuptools)
# pytest-xdist: the parallel test workers of a machine without a GPU (scripts/run_tests.sh);
# a GPU machine runs its tests one at a time, and may have no index to install from.
if ! have xdist && [ "$gpus_listed" -eq 0 ]; then
  need+=(pytest-xdist)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "[setup_env] installing: ${need[*]}"
  pip_install "${need[@]}"
fi

echo "[setup_env] building jax_flashoverlap (JAX_FLASHOVERLAP_BUILD_CUDA=${JAX_FLASHOVERLAP_BUILD_CUDA:-auto})"
"$PY" setup.py -q build_ext --inplace
# Make the checkout importable from the venv (like an editable install, without pip).
site_dir="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$(pwd)" > "$site_dir/jax_flashoverlap_checkout.pth"
# Two ways a GPU machine ends up without the overlap, said here where the build's and pip's own
# output went by: JAX sees none of the GPUs nvidia-smi lists (its CPU build, or a CUDA plugin
# that failed to start; unless JAX_PLATFORMS leaves the GPU out on purpose), or JAX sees them
# but no extension was built (setup.py's note says why, e.g. no nvcc found).
GPUS_LISTED="$gpus_listed" JAX_CUDA="$jax_cuda" DRIVER_CUDA="${cuda_major:-}" PY_PATH="$(cd "$(dirname "$PY")" && pwd)/${PY##*/}" "$PY" -c "
import importlib.util, os
import jax_flashoverlap as fo
i = fo.info()
print('[setup_env] extension built:', i['extension_built'], '| backend:', i['default_backend'], '| gpus:', i['gpus'])
listed, platforms = int(os.environ['GPUS_LISTED']), os.environ.get('JAX_PLATFORMS', '')
if listed and not i['gpus'] and (not platforms or 'cuda' in platforms or 'gpu' in platforms):
  plugins = [p for p in ('jax_cuda13_plugin', 'jax_cuda12_plugin') if importlib.util.find_spec(p)]
  cuda, driver = os.environ['JAX_CUDA'], os.environ['DRIVER_CUDA'] or 'not said'
  fix = ('for the GPUs: %s -m pip install \'jax[%s]\'' % (os.environ['PY_PATH'], cuda) if cuda else
         'JAX\'s CUDA builds need a CUDA 12 or 13 driver (nvidia-smi\'s CUDA version: %s)' % driver)
  why = ('its CUDA plugin (%s) did not start: JAX said why above' % ', '.join(plugins) if plugins
         else 'it is the CPU build (no jax-cuda13-plugin or jax-cuda12-plugin); ' + fix)
  print('[setup_env] WARNING: nvidia-smi lists %d GPU(s) but JAX sees none, so every op runs on %s, not on the GPUs: %s' % (listed, i['default_backend'], why))
elif i['gpus'] and not i['extension_built']:
  print('[setup_env] WARNING: GPUs here but no CUDA extension, so every op runs as XLA dot + collective, with no overlap:', i.get('extension_error'))
"
