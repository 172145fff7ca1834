#!/usr/bin/env bash
# Session 39, call 6 (one H100, warm after call 5): call 5's one lead, the static round robin
# (FLASHOVERLAP_GEMM_QUEUE=static) at 4096 x 8192 x 4096 per GPU (0.963 against the default's
# 0.936 / 0.939, inside what one run spreads), alternated with the default three times each,
# 40 samples a run.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r6; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run6.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
i=0
for r in 1 2 3; do for v in default FLASHOVERLAP_GEMM_QUEUE=static; do
  i=$((i+1)); name="${i}_${v//=/_}"
  if [ "$v" = default ]; then e=(); else e=("$v"); fi
  timeout 80 env "${e[@]}" python3 -m jax_flashoverlap.bench gemm --shapes 4096x8192x8192 --comm-sms 0 --samples 40 --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc $?" >> $OUT/rc.txt
done; done
echo "== summary"; cat $OUT/rc.txt; for f in $OUT/[0-9]_*.log; do echo "-- ${f##*/} $(grep 'xla/ours' $f)"; done
tar -czf $O/logs.tgz -C $OUT .
