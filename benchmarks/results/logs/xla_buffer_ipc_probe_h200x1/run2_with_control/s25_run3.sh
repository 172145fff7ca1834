#!/usr/bin/env bash
# Session 25, call 3 (one GPU): can another process map XLA's buffers by CUDA IPC (the
# staged all-reduce's copy-out would go)? Under each allocator setting; a cuMemAlloc control.
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
cp tmp_device/s25_run3.sh tmp_device/s25_xla_pool_probe.py $OUT/
P=tmp_device/s25_xla_pool_probe.py
for cfg in "default"; do
  f=/tmp/h_$RANDOM; echo "== $cfg"
  E=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.3); [ "$cfg" != default ] && E+=("$cfg")
  timeout 120 "${E[@]}" python3 $P export $f > $OUT/exp_${cfg//[=]/_}.log 2>&1 &
  timeout 120 python3 $P import $f > $OUT/imp_${cfg//[=]/_}.log 2>&1
  wait
  tail -2 $OUT/exp_${cfg//[=]/_}.log; tail -1 $OUT/imp_${cfg//[=]/_}.log
done
tar -czf $O/logs.tgz -C $OUT .
