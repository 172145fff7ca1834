#!/usr/bin/env bash
# One call on the GPU machine (device tool): set up, build, test, benchmark; logs to $OUT.
#   bash scripts/gpu_session.sh [STEP ...]   steps: build info tests gemm_bench overlap_bench
#                                            quickstart cuda_tests (default: build info tests)
# Carry: .whl (nvidia-cutlass wheel; the machine has no index) and build/obj (object cache).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/fo_out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
fi
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(build info tests)
summary=()
run_step() {
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-400}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -1 "$OUT/$name.log" | cut -c1-90)")")
  return $rc
}
for step in "${steps[@]}"; do
  case "$step" in
    build) run_step build env JAX_FLASHOVERLAP_BUILD_CUDA=1 python3 setup.py build_ext --inplace || { cat "$OUT/build.log" | tail -40; break; } ;;
    info) run_step info python3 -m jax_flashoverlap.info ;;
    tests) run_step tests python3 -m pytest -q -x -ra tests ;;
    gpu_tests) run_step gpu_tests env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -m "gpu or multigpu" tests ;;
    gemm_bench) run_step gemm_bench python3 -m jax_flashoverlap.bench gemm --out "$OUT/gemm_h200.json" ;;
    overlap_bench) run_step overlap_bench python3 -m jax_flashoverlap.bench overlap --out "$OUT/overlap_h200x2.json" ;;
    sweep) run_step sweep python3 -m jax_flashoverlap.bench sweep --samples 10 ${SWEEP_ARGS:-} --out "$OUT/sweep_h200x2.json" ;;
    quickstart) run_step quickstart python3 examples/quickstart.py ;;
    cuda_tests) run_step cuda_tests bash tests/cuda/run_gpu.sh ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
echo "==== summary"; printf '%s\n' "${summary[@]}"
