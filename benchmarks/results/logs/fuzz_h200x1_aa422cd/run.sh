#!/usr/bin/env bash
# Session 16, call 3: the fuzz test and script with untuned references.
O=$OUT; export OUT=/tmp/o7; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1
tail -1 $OUT/session.txt
export PYTHONPATH=/tmp/site:$(pwd)
timeout 150 python3 -m pytest -q -ra --durations=5 tests/test_gpu_fuzz.py > $OUT/test_gpu_fuzz.log 2>&1
echo "pytest rc=$?"; tail -12 $OUT/test_gpu_fuzz.log
timeout 230 python3 benchmarks/fuzz.py --cases 400 --seconds 170 --seed 1618 --out $OUT/fuzz_h200x1.json > $OUT/fuzz.log 2>&1
echo "fuzz rc=$?"; grep -c " ok " $OUT/fuzz.log; grep " FAIL " $OUT/fuzz.log | head -20; tail -8 $OUT/fuzz.log
tar -czf $O/logs.tgz -C $OUT .
