#!/usr/bin/env bash
# Session 53: the whole GPU suite at HEAD on one GPU, in two calls (PARTS="1 2 4", then
# PARTS=3): its last whole run was session 44's at 84845c0, and 47 commits to xla_ffi/ and
# jax_flashoverlap/ came since. Kernel objects come in .gpu_obj (host ones too, as the device
# compiled them in session 53's first calls). Each part's logs in $OUT/part<N>/.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
T0=$SECONDS; LIMIT=${RUN_LIMIT:-570}; PARTS=${PARTS:-1 2 4}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 timeout 200 bash scripts/gpu_session.sh build info > $OUT/session_build.txt 2>&1
echo "build rc=$? $((SECONDS - T0)) s" >> $OUT/summary.txt
for p in $PARTS; do
  left=$((LIMIT - (SECONDS - T0) - 20))  # a part's pytest must end before the call's limit
  [ $left -ge 60 ] || { echo "== part $p not run: $left s left" >> $OUT/summary.txt; continue; }
  mkdir -p $OUT/part$p
  OUT=$OUT/part$p GPU_PART=$p STEP_TIMEOUT=$left timeout $((left + 5)) \
    bash scripts/gpu_session.sh gpu_part > $OUT/part$p/session.txt 2>&1
  { echo "== part $p rc=$?"; sed -n '/==== summary/,$p' $OUT/part$p/session.txt; } >> $OUT/summary.txt
done
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt $OUT/summary.txt
for p in $PARTS; do [ -e $OUT/part$p/gpu_part$p.log ] && grep -E "^(FAILED|ERROR)|passed|failed" $OUT/part$p/gpu_part$p.log | tail -8; done
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
