#!/usr/bin/env bash
# Session 45, call 2: per-instruction (SASS) stall samples from call 1's Nsight Compute reports.
cd tmp_device/prof45
for r in prof_4096x8192x4096/*.ncu-rep; do
  b=$(basename $r .ncu-rep)
  ncu --import $r --page source --csv --print-source sass > /tmp/$b.sass.csv 2> /tmp/$b.err
  echo "$b rc=$? lines=$(wc -l < /tmp/$b.sass.csv)"; head -c 300 /tmp/$b.err
done
cd /tmp && tar -czf $OUT/sass.tgz *.sass.csv && ls -la $OUT
head -3 /tmp/ours*.sass.csv | cut -c1-600
