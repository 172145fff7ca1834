#!/usr/bin/env bash
# Session 56, call 1 (one GPU): setup_env.sh's new GPU-machine checks against the real driver.
# (1) driver_cuda_major from the real nvidia-smi; (2) the README's setup in a fresh .venv (CUDA
# JAX from the system: nothing installed, no warning expected) and the main job; (3) the same
# venv with CUDA_VISIBLE_DEVICES= (nvidia-smi still lists the GPU, JAX's CUDA plugin finds none):
# the "did not start" warning expected, naming the plugin module.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
nvidia-smi > $OUT/nvidia_smi.txt 2>&1
echo "driver_cuda_major=$(source scripts/_gpus.sh; driver_cuda_major) gpu_count=$(source scripts/_gpus.sh; gpu_count)" >> $S
python3 -c "import importlib.util as u; print({p: bool(u.find_spec(p)) for p in ('jax_cuda13_plugin', 'jax_cuda12_plugin')})" >> $S 2>&1
rm -rf build/obj .venv && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
t1=$SECONDS; timeout 300 bash scripts/setup_env.sh > $OUT/setup_env.log 2>&1
echo "setup_env rc=$? $((SECONDS - t1)) s | warnings: $(grep -c WARNING $OUT/setup_env.log) | $(tail -n 1 $OUT/setup_env.log)" >> $S
t1=$SECONDS; timeout 200 .venv/bin/python examples/quickstart.py > $OUT/quickstart.log 2>&1
echo "quickstart rc=$? $((SECONDS - t1)) s | $(tail -n 2 $OUT/quickstart.log | tr '\n' ' ')" >> $S
t1=$SECONDS; CUDA_VISIBLE_DEVICES= timeout 300 bash scripts/setup_env.sh > $OUT/setup_env_hidden.log 2>&1
echo "setup_env (CUDA_VISIBLE_DEVICES=) rc=$? $((SECONDS - t1)) s" >> $S
grep "WARNING\|extension built" $OUT/setup_env_hidden.log >> $S
cat $OUT/gpu.txt $S
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
