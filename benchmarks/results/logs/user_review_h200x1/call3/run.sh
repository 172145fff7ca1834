#!/usr/bin/env bash
# Session 29, call 3 (one GPU): the user-eye review's fixes on the GPU: info (settings,
# tuned configs), a bench overlap line (others printed), GPU part 1 (ops, mesh, global views
# with the new partitioner checks, examples, Flax), at the commit given.
O=$OUT; export OUT=/tmp/s29r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s29_run3.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
bash scripts/gpu_session.sh build > $OUT/build.txt 2>&1; tail -1 $OUT/build.txt
export PYTHONPATH="/tmp/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-200)"; }
run info 120 python3 -m jax_flashoverlap.info
run info_typo 120 env JAX_FLASHOVERLAP_TRANSPORT=nvlink python3 -m jax_flashoverlap.info
run bench 200 python3 -m jax_flashoverlap.bench overlap --shapes 4096x8192x8192 --world 1 --samples 5 --calls 5 --trace 0 --variants two_chunk --out $OUT/bench.json
GPU_PART=1 STEP_TIMEOUT=300 timeout 320 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -2 $OUT/session1.txt
grep -E '"settings"|"tuned_configs"|"files"|invalid' -A1 $OUT/info.log | head -12
grep -E "4096x8192x8192:" $OUT/bench.log | cut -c1-400
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part1.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
