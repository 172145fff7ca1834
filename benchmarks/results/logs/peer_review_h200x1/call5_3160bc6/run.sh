#!/usr/bin/env bash
# Session 26, call 5 (one GPU): the handle types of XLA's buffers (tmp_device/s26_handle_probe.py)
# under the default and the platform allocator.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
cp tmp_device/s26_run5.sh $OUT/run.sh; cp tmp_device/s26_handle_probe.py $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
for a in default platform; do
  if [ $a = default ]; then env -u XLA_PYTHON_CLIENT_ALLOCATOR timeout 120 python3 tmp_device/s26_handle_probe.py > $OUT/probe_$a.log 2>&1
  else XLA_PYTHON_CLIENT_ALLOCATOR=$a timeout 120 python3 tmp_device/s26_handle_probe.py > $OUT/probe_$a.log 2>&1; fi
  grep PROBE $OUT/probe_$a.log || tail -5 $OUT/probe_$a.log
done
tar -czf $O/logs.tgz -C $OUT .
