#!/usr/bin/env bash
# Session 16, call 1: the randomized kernel check (benchmarks/fuzz.py) on one H200.
O=$OUT; export OUT=/tmp/o5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1
tail -2 $OUT/session.txt
export PYTHONPATH=/tmp/site:$(pwd)
timeout 200 python3 -m pytest -q -ra tests/test_gpu_fuzz.py > $OUT/test_gpu_fuzz.log 2>&1
tail -15 $OUT/test_gpu_fuzz.log
timeout 230 python3 benchmarks/fuzz.py --cases 110 --seed 1616 --out $OUT/fuzz_h200x1.json > $OUT/fuzz.log 2>&1
echo "fuzz rc=$?"; grep -c " ok " $OUT/fuzz.log; grep " FAIL " $OUT/fuzz.log | head -20; tail -6 $OUT/fuzz.log
tar -czf $O/logs.tgz -C $OUT .
