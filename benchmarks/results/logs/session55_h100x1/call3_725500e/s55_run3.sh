#!/usr/bin/env bash
# Session 55, call 3 (one H100, warm): compute-sanitizer on the CUDA 13.5 harness at world 1,
# as gpu_session.sh's sanitize_harness step runs the 13.0 one (small, unaligned shape; every
# NCCL op, then the peer stores): memcheck, racecheck, synccheck, and memcheck without CUDA
# API errors (NCCL's own probes report some).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
S=$OUT/summary.txt
export LD_LIBRARY_PATH="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HARNESS_BIN=$PWD/tmp_device/cu135/build/overlap_harness HARNESS_TIMEOUT=150 WORLD=1
T0=$SECONDS
for ops in "ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g" "pr_rs,pr_ar"; do
  o=$([ "${ops:0:2}" = pr ] && echo peer || echo nccl)
  for tool in memcheck racecheck synccheck memcheck_noapi; do
    [ $((SECONDS - T0)) -lt 400 ] || { echo "${tool}_$o not run" >> $S; continue; }
    t1=$SECONDS
    if [ $tool = memcheck_noapi ]; then
      SANITIZER_ARGS="--report-api-errors no" SANITIZER_TAG=_${o}_noapi timeout 170 bash tests/cuda/run_overlap_harness.sh memcheck $OUT/san --m 320 --n 272 --k 200 --calls 1 --ops $ops > $OUT/${tool}_$o.txt 2>&1
    else
      SANITIZER_TAG=_$o timeout 170 bash tests/cuda/run_overlap_harness.sh $tool $OUT/san --m 320 --n 272 --k 200 --calls 1 --ops $ops > $OUT/${tool}_$o.txt 2>&1
    fi
    echo "${tool}_$o rc=$? $((SECONDS - t1)) s | ok=$(grep -c ' OK$' $OUT/${tool}_$o.txt) | $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|SYNCCHECK SUMMARY' $OUT/${tool}_$o.txt | tr '\n' ' ')" >> $S
  done
done
cat $S
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
