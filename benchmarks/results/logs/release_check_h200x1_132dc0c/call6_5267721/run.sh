#!/usr/bin/env bash
# Session 25, call 6 (one GPU): the bench at its final commit (targets, bench_record) end to end; as call 4 (rows written as they finish, the plan's
# transport, no capped column for peer plans) end to end on a GPU, and the README's main job.
O=$OUT; export OUT=/tmp/r6; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s25_run6.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=200 timeout 500 bash scripts/gpu_session.sh build bench_smoke quickstart > $OUT/session.txt 2>&1
tail -6 $OUT/session.txt
python3 -c "
import json
for f in ['bench_gemm_smoke', 'bench_overlap_smoke', 'bench_a2a_smoke']:
    d = json.load(open('$OUT/' + f + '.json'))
    print(f, 'complete', d.get('complete'), 'rows', len(d['rows']), 'commit', d['git_commit'],
          [r.get('plan', {}).get('transport') for r in d['rows']], d.get('targets', {}).get('speedup_at_least_1'))
"
tar -czf $O/logs.tgz -C $OUT .
