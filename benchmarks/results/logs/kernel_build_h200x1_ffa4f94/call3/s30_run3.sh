#!/usr/bin/env bash
# Session 30, call 3 (one GPU), after the review: the digest now also covers the device flags and CUTLASS: the extension built on the GPU machine reports the kernel
# build (the digest setup.py computes of xla_ffi/kernels + comm); the tuner at world 1 records
# it in each entry; a config whose entry names another build warns (KernelBuildWarning) and is
# still used, values equal XLA's; then GPU part 1 (ops, global views, Flax examples: the row
# bias now annotated (None,)).
O=$OUT; export OUT=/tmp/s30r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s30_run3.sh tmp_device/s30_stale.py $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
run info 60 python3 -m jax_flashoverlap.info
python3 - <<'PY'
import json, os, re
text = open(os.environ["OUT"] + "/info.log").read()
d = json.loads(text[text.index("{"):])
print("info kernel_build", d["build"]["kernel_build"], "expected", os.environ.get("EXPECTED_BUILD"),
      "match", d["build"]["kernel_build"] == os.environ.get("EXPECTED_BUILD"),
      "| by file", d["tuned_configs"]["entries_by_kernel_build"])
PY
run tune 200 python3 -m jax_flashoverlap.tune --shapes 4096x8192x8192 --collectives all_reduce reduce_scatter --comm-sms 16 --top 1 --samples 3 --calls 5 --cta-policies default --out $OUT/tune_cfg.json --report $OUT/tune_report.json
python3 -c "import json; d=json.load(open('$OUT/tune_cfg.json')); print('tuned entries', [(e['collective'], e.get('kernel')) for e in d['entries']]); print('report kernel_build', json.load(open('$OUT/tune_report.json')).get('kernel_build'))"
run stale 120 env JAX_FLASHOVERLAP_FALLBACK=0 PYTHONPATH=. python3 tmp_device/s30_stale.py $OUT/tune_cfg.json $OUT/stale_dir
tail -4 $OUT/stale.log
GPU_PART=1 STEP_TIMEOUT=260 timeout 270 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -1 $OUT/session1.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part1.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
