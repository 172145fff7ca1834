#!/usr/bin/env bash
# A/B of gemm_test builds by Nsight Compute metrics: kernel time, SM clock and the share of
# cycles the tensor pipe was busy (clock-independent), for our GEMM only, twice each.
#   SHAPES="MxNxK:COMM ..." BINS="gemm_test_base gemm_test" OUT=dir bash benchmarks/ncu_ab.sh
# A BINS entry may carry one environment setting after '@', e.g.
# "gemm_test gemm_test@FLASHOVERLAP_GEMM_SCHEDULE=pingpong" (one binary, two kernels).
# (binaries under .build/; `gemm_test profile` launches the kernel 5 times, the 3rd is read)
set -u
[ -n "${OUT:-}" ] || { echo "usage: [SHAPES=...] [BINS=...] OUT=dir bash benchmarks/ncu_ab.sh (set OUT: the results go to \$OUT/ab)" >&2; exit 2; }
SHAPES="${SHAPES:-8192x8192x4096:0 8192x8192x4096:16 8192x28672x4096:0 4096x8192x4096:0}"
command -v ncu >/dev/null || { echo "needs Nsight Compute's ncu on PATH" >&2; exit 2; }
for b in ${BINS:-gemm_test_base gemm_test}; do  # every binary there before anything runs
  [ -x ".build/${b%%@*}" ] || { echo "no .build/${b%%@*} (BINS entry '$b'; run from the repository root)" >&2; exit 2; }
done
for S in $SHAPES; do
  [[ "$S" =~ ^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*:[0-9]+$ ]] || { echo "SHAPES entries are MxNxK:COMM, got '$S'" >&2; exit 2; }
done
P=$OUT/ab; mkdir -p "$P"
# EXTRA_METRICS=",name,...": more metrics after those three (printed in ncu's order).
M="--metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed${EXTRA_METRICS:-}"
echo "shape comm binary: duration (us or ms), SM clock (GHz), tensor pipe busy (%)${EXTRA_METRICS:-}" | tee -a "$P/ab.txt"
for S in $SHAPES; do
  sh=${S%%:*}; c=${S##*:}
  for rep in 1 2; do
    for b in ${BINS:-gemm_test_base gemm_test}; do
      e=(); [[ "$b" == *@* ]] && e=("${b#*@}")
      r=$(env "${e[@]}" ncu --clock-control none $M -k regex:SignalingGemm --launch-skip 2 --launch-count 1 \
            ".build/${b%%@*}" profile --shape "$sh" --comm "$c" 2>&1 | grep -E "^ *(gpu__|sm__|dram__|lts__|l1tex__)" | awk '{print $NF}' | tr '\n' ' ')
      echo "$sh c$c $b: $r" | tee -a "$P/ab.txt"
    done
  done
done
