#!/usr/bin/env bash
# Session 55, call 5: only on an H200, the epilogue question (session 51's call, unchanged:
# benchmarks/results/logs/epilogue_balanced_h100x1_a90b04e/run.sh); on an H100 nothing.
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
RUN_LIMIT=${RUN_LIMIT:-540} exec bash benchmarks/results/logs/epilogue_balanced_h100x1_a90b04e/run.sh
