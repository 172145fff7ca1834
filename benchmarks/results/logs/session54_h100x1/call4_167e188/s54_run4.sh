#!/usr/bin/env bash
# Session 54, call 4 (one GPU): the GPU tests with the CUDA 13.5 module as gpu_session.sh's
# gpu_part runs them (JAX_FLASHOVERLAP_FALLBACK=0: our kernels even where the plan predicts no
# gain, as on one GPU; -m "gpu or multigpu"): calls 2 and 3 ran the files without either, so
# some of their tests took XLA's path and some were CPU checks. Parts 1 and 2, then part 4 if
# time is left.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$SECONDS; LIMIT=${RUN_LIMIT:-400}
left() { echo $((LIMIT - (SECONDS - T0))); }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
cp tmp_device/cu135/_xla_ffi.cpython-312-x86_64-linux-gnu.so jax_flashoverlap/
export LD_LIBRARY_PATH="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -m jax_flashoverlap.info > $OUT/info.log 2>&1
grep -E '"cuda_runtime_compiled"|"kernel_build"' $OUT/info.log | head -2 >> $S
parts() { bash -c 'source <(sed -n "/^GPU_PARTS=(/,/^)/p" scripts/gpu_session.sh); echo ${GPU_PARTS['$1']}'; }
for p in 1 2 4; do
  t=$(( $(left) - 10 )); [ $t -gt 60 ] || { echo "part $p not run: $(left) s left" >> $S; continue; }
  t1=$SECONDS
  timeout $t env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -p no:cacheprovider -m "gpu or multigpu" $(parts $((p - 1))) > $OUT/part$p.log 2>&1
  echo "part $p rc=$? $((SECONDS - t1)) s | $(tail -n 1 $OUT/part$p.log)" >> $S
done
cat $OUT/gpu.txt $S
grep -hE "^(FAILED|ERROR)" $OUT/part*.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
