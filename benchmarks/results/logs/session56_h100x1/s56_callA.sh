#!/usr/bin/env bash
# Session 56, call A of docs/multi_gpu_runbook.md (2 GPUs): the peer stores' bounded standalone
# check, then build + tune (#5). Kernel and host objects from .gpu_obj.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
T0=$SECONDS
nvidia-smi -L > $OUT/gpu.txt 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv >> $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$n" -ge 2 ] || { echo "only $n GPU(s): call A not run"; exit 0; }
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
timeout 60 .build/peer_reduce_2gpu_test check --json $OUT/pr2.json > $OUT/pr2.log 2>&1 && P=--peer || P=
echo "peer check rc -> TUNE_ARGS='$P' $((SECONDS - T0)) s" | tee $OUT/summary.txt
left=$((565 - (SECONDS - T0)))
STEP_TIMEOUT=$((left - 40)) TUNE_ARGS="$P" timeout $left bash scripts/gpu_session.sh build tune > $OUT/session.txt 2>&1
echo "gpu_session rc=$? $((SECONDS - T0)) s" >> $OUT/summary.txt
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/summary.txt; sed -n '/==== summary/,$p' $OUT/session.txt | tail -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
