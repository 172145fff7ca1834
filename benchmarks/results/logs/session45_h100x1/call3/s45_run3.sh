#!/usr/bin/env bash
# Session 45, call 3 (one GPU): this session's GPU-facing changes at COMMIT. GPU part 4 (the new
# control-flow tests, the destroy / clear_caches test, the cache tests; the device-order tests
# skip on one GPU), the global view's GPU tests (the partitioner's mesh now in the program's
# device order), and the bench rows' new `gpu` field on a GPU.
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf $OUT/obj.tgz -C build/obj "${new[@]}"
STEP_TIMEOUT=300 GPU_PART=4 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part4.txt 2>&1
STEP_TIMEOUT=200 GPU_FILES="tests/test_gpu_global_view.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_gpu_files.txt 2>&1
export PYTHONPATH=/tmp/site:$(pwd)
timeout 120 python3 -m jax_flashoverlap.bench overlap --world 1 --shapes 2048x2048x2048 --variants --samples 3 --calls 3 --trace 0 --out $OUT/bench_gpu_field.json > $OUT/bench_gpu_field.txt 2>&1; echo "bench rc=$?" >> $OUT/bench_gpu_field.txt
python3 -c "import json; d=json.load(open('$OUT/bench_gpu_field.json')); print([(r['collective'], r['gpu'], r['pair_ceiling_e']) for r in d['rows']])" >> $OUT/bench_gpu_field.txt 2>&1
echo "== summary"; tail -3 $OUT/bench_gpu_field.txt; tail -1 $OUT/session_gpu_part4.txt $OUT/session_gpu_files.txt; grep -hE '^(FAILED|ERROR)' $OUT/*.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz --exclude=obj.tgz * && find . -maxdepth 1 -type f ! -name obj.tgz -delete && mv /tmp/logs.tgz . && ls -la
