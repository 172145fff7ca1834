#!/usr/bin/env bash
# Session 55, call 1 (one GPU). On an H200: the H200 epilogue question (session 51's call,
# benchmarks/results/logs/epilogue_balanced_h100x1_a90b04e/run.sh), unchanged. On an H100:
# GPU test part 3 (peer stores, faults, watchdog, threads, harness, fuzz) with the CUDA 13.5
# module (session 54 ran parts 1, 2, 4 with it; the harness fixtures build from the 13.0
# objects, .gpu_obj), then the 13.5 builds of the JAX-free programs (built on the CPU machine:
# tmp_device/cu135/build) run as test_gpu_harness runs them, at world 1.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
if grep -q H200 $OUT/gpu.txt; then
  exec bash benchmarks/results/logs/epilogue_balanced_h100x1_a90b04e/run.sh
fi
T0=$SECONDS; LIMIT=${RUN_LIMIT:-560}
left() { echo $((LIMIT - (SECONDS - T0))); }
S=$OUT/summary.txt
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
cp tmp_device/cu135/_xla_ffi.cpython-312-x86_64-linux-gnu.so jax_flashoverlap/
export LD_LIBRARY_PATH="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -m jax_flashoverlap.info > $OUT/info.log 2>&1
grep -E '"cuda_runtime_compiled"|"kernel_build"' $OUT/info.log | head -2 >> $S
parts() { bash -c 'source <(sed -n "/^GPU_PARTS=(/,/^)/p" scripts/gpu_session.sh); echo ${GPU_PARTS['$1']}'; }
t=$(( $(left) - 150 ))
t1=$SECONDS
timeout $t env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -p no:cacheprovider -m "gpu or multigpu" $(parts 2) > $OUT/part3.log 2>&1
echo "part 3 (13.5 module) rc=$? $((SECONDS - t1)) s | $(tail -n 1 $OUT/part3.log)" >> $S
# The 13.5 programs, as test_gpu_harness runs them (each bounded by HARNESS_TIMEOUT)
B=tmp_device/cu135/build
h() { local tag=$1; shift; [ $(left) -gt 40 ] || { echo "$tag not run: $(left) s left" >> $S; return; }
  HARNESS_BIN=$B/overlap_harness HARNESS_TIMEOUT=60 WORLD=1 timeout 90 bash tests/cuda/run_overlap_harness.sh none $OUT/h135_$tag "$@" > $OUT/h135_$tag.log 2>&1
  echo "13.5 harness $tag rc=$? ok=$(grep -c ' OK$' $OUT/h135_$tag.log) mism=$(grep -c 'mismatches [1-9]' $OUT/h135_$tag.log)" >> $S; }
h ops --calls 2 --ops ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g
h ops_unaligned --calls 2 --ops ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g --m 320 --n 272 --k 200
h peer --ops pr_rs,pr_ar --calls 4
h peer_unaligned --ops pr_rs,pr_ar --m 320 --n 272 --k 200
h peer_waves --ops pr_rs,pr_ar --m 4096 --n 1024 --k 256
h peer_watchdog --ops pr_rs,pr_ar --watchdog 30 --calls 3
h peer_staged --ops pr_rs,pr_ar --stage-mirrors 1 --calls 3
h grow --ops pr_rs,pr_ar,ar --calls 8 --grow 6
h inject_grow --inject grow --ops pr_ar
for p in "peer_reduce_test check" peer_access_test agreement_test; do
  [ $(left) -gt 30 ] || break
  timeout 60 $B/$p > $OUT/${p%% *}.log 2>&1; echo "13.5 $p rc=$? | $(tail -n 1 $OUT/${p%% *}.log)" >> $S
done
cat $OUT/gpu.txt $S
grep -hE "^(FAILED|ERROR)" $OUT/part3.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
