#!/usr/bin/env bash
# One call on the GPU machine (device tool): set up, build, test, benchmark; logs to $OUT.
#   bash scripts/gpu_session.sh [STEP ...]   steps: build info tests gpu_tests gpu_k gpu_files gpu_part mesh_tests gemm_bench
#     tune overlap_bench overlap_all sweep procs stress fuzz flax_example sanitize_overlap harness
#     harness_peer sanitize_harness gemm_epilogue transpose_w helpers quickstart
#     global_view diagnose a2a_tests a2a_bench readme_tests cuda_tests launch_smoke bench_smoke peer peer_programs
#     peer_bench peer_tune peer_spin peer_groups epilogue_ab tile_probe
#     pack (last: one archive of $OUT)
#     (default: build info tests)
# Carry: .whl (nvidia-cutlass wheel; the machine has no index) and build/obj (object cache).
# Environment it reads: OUT (logs; default /tmp/fo_out), TAG (result names; default
# <model>xN: h200x2, h100x2),
# STEP_TIMEOUT (seconds per step; 400, the pytest steps 560), GPU_PART (1..4, gpu_part),
# GPU_FILES / GPU_FILES_SUFFIX (gpu_files), PYTEST_K (gpu_k), and extra arguments per step:
# TUNE_ARGS, OVERLAP_ARGS, SWEEP_ARGS, PROCS_ARGS, STRESS_ARGS, FLAX_ARGS / FLAX_SUFFIX,
# TW_ARGS (transpose_w), FUZZ_SECONDS (240), HARNESS_SAN_OPS (sanitize_harness),
# DIAGNOSE_OPS (diagnose), AB_ARGS (epilogue_ab), CUBLAS_LIB (gemm_epilogue, transpose_w,
# tile_probe: found under /usr, /opt).
set -uo pipefail
OUT="${OUT:-/tmp/fo_out}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # a relative OUT: the caller's
cd "$(dirname "$0")/.."
source scripts/_gpus.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# cuBLAS for the standalone programs' baselines (gemm_epilogue, transpose_w, tile_probe): the
# caller's CUBLAS_LIB, else the first libcublas.so.13 under /usr or /opt.
find_cublas() {
  export CUBLAS_LIB="${CUBLAS_LIB:-$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)}"
}
# The GPU tests in four parts (step gpu_part, GPU_PART=1..4): the whole suite outgrew one
# device call (over 440 s on one GPU; in session 30, 85 of its 168 tests skipped there). Every
# tests/test_gpu*.py is in exactly one part (tests/test_session_script.py checks). Part 4 (session
# 43): the cache and determinism files' child processes took part 2 past 260 s on one H100.
GPU_PARTS=(
  "tests/test_gpu_build.py tests/test_gpu.py tests/test_gpu_mesh.py tests/test_gpu_global_view.py tests/test_gpu_examples.py tests/test_gpu_large.py tests/test_gpu_in_place.py tests/test_gpu_switch_checks.py"
  "tests/test_gpu_a2a.py tests/test_gpu_gathered.py tests/test_gpu_transpose_w.py tests/test_gpu_cta_policy.py tests/test_gpu_trace.py"
  "tests/test_gpu_peer.py tests/test_gpu_faults.py tests/test_gpu_watchdog.py tests/test_gpu_threads.py tests/test_gpu_harness.py tests/test_gpu_fuzz.py"
  "tests/test_gpu_cache.py tests/test_gpu_determinism.py tests/test_gpu_control_flow.py tests/test_gpu_mesh_order.py tests/test_gpu_memory.py"
)
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(build info tests)
KNOWN_STEPS=" build info tests gpu_tests gpu_k gpu_part gpu_files mesh_tests gemm_bench
  overlap_bench sweep overlap_all procs tune stress fuzz flax_example sanitize_overlap harness
  harness_peer sanitize_harness gemm_epilogue transpose_w helpers quickstart launch_smoke
  bench_smoke global_view a2a_tests diagnose a2a_bench readme_tests pack cuda_tests peer_groups
  peer_spin peer peer_programs peer_bench peer_tune epilogue_ab tile_probe "
for step in "${steps[@]}"; do  # arguments checked before any setup (and before any step runs)
  if [[ ! " $(echo $KNOWN_STEPS) " == *" $step "* ]]; then
    echo "unknown step $step; the steps:$(echo $KNOWN_STEPS | sed 's/^/ /')"; exit 2
  fi
  if [[ "$step" == gpu_part && ! "${GPU_PART:-}" =~ ^[1-4]$ ]]; then
    echo "gpu_part: set GPU_PART=1, 2, 3 or 4"; exit 2
  fi
  if [[ "$step" == gpu_k && -z "${PYTEST_K:-}" ]]; then echo "gpu_k: set PYTEST_K"; exit 2; fi
  if [[ "$step" == gpu_files && -z "${GPU_FILES:-}" ]]; then echo "gpu_files: set GPU_FILES"; exit 2; fi
  if [[ "$step" == pack && "$step" != "${steps[-1]}" ]]; then echo "pack: must be the last step"; exit 2; fi
done
# Without a GPU only the steps that need none run (a CPU machine with nvcc builds the
# extension; tests runs the CPU suite): the others ran XLA's composition on CPU and filed it
# under the GPU machine's names (overlap_h200x0.json).
gpus=$(gpu_count)
if [ "$gpus" -eq 0 ]; then
  for step in "${steps[@]}"; do
    case "$step" in build|info|tests|pack) ;;
      *) echo "$step needs a GPU (nvidia-smi lists none here); without one: build info tests pack"
         exit 2 ;;
    esac
  done
fi
# Result files are named after the machine: h200x2, h100x2, ... (override with TAG=...): an
# H200 pair asked for may come as H100s, whose results (and tuned plans) are not H200's.
TAG="${TAG:-$(gpu_model)x$gpus}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
fi
summary=()
run_step() {
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-400}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -1 "$OUT/$name.log" | cut -c1-90)")")
  [ $rc -eq 0 ] || failed=1
  return $rc
}
failed=0  # any step with rc != 0: the script's exit status
gpu_pytest() {  # NAME PYTEST_ARGS...: the GPU-marked tests, our kernels at every shape
  local name="$1"; shift
  run_step "$name" env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -m "gpu or multigpu" "$@"
}
peer_programs() {  # the peer stores' standalone checks (.build/: tests/cuda/build_overlap_harness.sh)
  run_step peer_reduce .build/peer_reduce_test all --json "$OUT/peer_reduce.json"
  run_step peer_reduce_2gpu .build/peer_reduce_2gpu_test all --json "$OUT/peer_reduce_2gpu.json"
  ngpu=$(gpu_count)
  for pw in 4 8; do  # the whole group where the machine has 4 or 8 GPUs
    [ "$ngpu" -ge "$pw" ] && run_step "peer_reduce_${pw}gpu" .build/peer_reduce_2gpu_test all --world "$pw" --json "$OUT/peer_reduce_${pw}gpu.json"
  done
  # ranks in processes of their own (CUDA IPC): the sequence, the handler (harness)
  run_step peer_reduce_ipc .build/peer_reduce_ipc_test check --world "$((ngpu < 8 ? ngpu : 8))" --json "$OUT/peer_reduce_ipc.json"
  run_step peer_staged .build/peer_reduce_ipc_test bench_staged --json "$OUT/peer_staged.json"
  [[ -n "${harness_built:-}" ]] || { run_step harness_build bash tests/cuda/build_overlap_harness.sh && harness_built=1; }
  run_step hpeer_procs bash tests/cuda/run_overlap_harness.sh none "$OUT/hpeer_procs" --ops pr_rs,pr_ar --calls 4
  run_step hpeer_procs_odd bash tests/cuda/run_overlap_harness.sh none "$OUT/hpeer_procs_odd" --ops pr_rs,pr_ar --m 320 --n 272 --k 200
}
for step in "${steps[@]}"; do
  case "$step" in
    build) run_step build env JAX_FLASHOVERLAP_BUILD_CUDA=1 python3 setup.py build_ext --inplace || { cat "$OUT/build.log" | tail -40; break; } ;;
    info) run_step info python3 -m jax_flashoverlap.info ;;
    tests) run_step tests python3 -m pytest -q -x -ra tests ;;
    gpu_tests)  # over 440 s on one H200 (168 tests in session 30): gpu_part runs it in parts
      STEP_TIMEOUT="${STEP_TIMEOUT:-560}" gpu_pytest gpu_tests tests ;;
    gpu_k) gpu_pytest gpu_k -k "${PYTEST_K:?set PYTEST_K}" tests ;;
    gpu_part)  # part GPU_PART (1..4, checked above) of GPU_PARTS
      STEP_TIMEOUT="${STEP_TIMEOUT:-560}" gpu_pytest "gpu_part$GPU_PART" ${GPU_PARTS[$((GPU_PART - 1))]} ;;
    gpu_files)  # the GPU tests of some files (GPU_FILES): the whole suite outgrows one call on 2+ GPUs
      STEP_TIMEOUT="${STEP_TIMEOUT:-560}" gpu_pytest "gpu_files${GPU_FILES_SUFFIX:-}" ${GPU_FILES:?set GPU_FILES} ;;
    mesh_tests) run_step mesh_tests env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -s tests/test_gpu_mesh.py ;;
    gemm_bench) run_step gemm_bench python3 -m jax_flashoverlap.bench gemm --out "$OUT/gemm_h200.json" ;;
    epilogue_ab)  # the signaling GEMM's three epilogues through JAX, one process (benchmarks/epilogue_ab.py)
      run_step epilogue_ab env -u FLASHOVERLAP_GEMM_EPILOGUE python3 benchmarks/epilogue_ab.py ${AB_ARGS:-} --out "$OUT/epilogue_ab_$TAG.json" ;;
    tile_probe)  # stock CUTLASS tiles, cuBLAS, ours' settings (.build/tile_probe: tests/cuda/build_tile_probe.sh, carried)
      find_cublas
      run_step tile_probe .build/tile_probe "$OUT/tile_probe_$TAG.json" ;;
    overlap_bench) run_step overlap_bench python3 -m jax_flashoverlap.bench overlap --out "$OUT/overlap_$TAG.json" ;;
    sweep) run_step sweep python3 -m jax_flashoverlap.bench sweep --samples 10 ${SWEEP_ARGS:-} --out "$OUT/sweep_$TAG.json" ;;
    overlap_all) run_step overlap_all python3 -m jax_flashoverlap.bench overlap ${OVERLAP_ARGS:-} --plot "$OUT/$TAG.png" --out "$OUT/$TAG.json" ;;
    procs)  # the same benchmark as 1 process x 2 GPUs and as 2 processes x 1 GPU
      run_step procs1 python3 -m jax_flashoverlap.bench overlap --variants ${PROCS_ARGS:-} --out "$OUT/procs1_$TAG.json"
      run_step procs2 python3 -m jax_flashoverlap.launch -n 2 --gpus-per-process 1 --timeout 500 -m jax_flashoverlap.bench overlap --variants ${PROCS_ARGS:-} --out "$OUT/procs2_$TAG.json" ;;
    tune)  # tuned plans for this machine into the package's configs (later steps use them)
      run_step tune python3 -m jax_flashoverlap.tune ${TUNE_ARGS:-} --out "jax_flashoverlap/configs/${TAG/%x$gpus/_x$gpus}.json" --report "$OUT/tune_$TAG.json"
      cp jax_flashoverlap/configs/*.json "$OUT/" ;;
    stress) run_step stress python3 benchmarks/stress.py ${STRESS_ARGS:-} --out "$OUT/stress_$TAG.json" ;;
    fuzz)  # random shapes / plans / kernel switches for FUZZ_SECONDS (benchmarks/fuzz.py)
      run_step fuzz python3 benchmarks/fuzz.py --cases 5000 --seconds "${FUZZ_SECONDS:-240}" --out "$OUT/fuzz_$TAG.json" ;;
    flax_example) run_step "flax_example${FLAX_SUFFIX:-}" python3 examples/tp_transformer_block.py --steps 20 ${FLAX_ARGS:-} --json "$OUT/tp_block_$TAG${FLAX_SUFFIX:-}.json" ;;
    sanitize_overlap)  # one overlapped call of each op under compute-sanitizer, 2 processes
      for tool in memcheck racecheck synccheck; do
        run_step "san_$tool" env XLA_FLAGS=--xla_gpu_autotune_level=0 python3 -m jax_flashoverlap.launch -n 2 --gpus-per-process 1 --timeout 280 tests/cuda/sanitize_overlap.py "$tool" "$OUT/sanitize"
      done
      grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|SYNCCHECK SUMMARY" "$OUT"/sanitize/*.log > "$OUT/sanitize_summary.txt" 2>&1 ;;
    harness)  # the overlapped ops without JAX (tests/cuda/overlap_harness.cc), one process per GPU
      run_step harness_build bash tests/cuda/build_overlap_harness.sh && harness_built=1
      run_step harness bash tests/cuda/run_overlap_harness.sh none "$OUT/harness" --calls 3
      run_step harness_odd bash tests/cuda/run_overlap_harness.sh none "$OUT/harness_odd" --m 320 --n 272 --k 200 --ops ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g
      run_step harness_spin env JAX_FLASHOVERLAP_WAIT=spin bash tests/cuda/run_overlap_harness.sh none "$OUT/harness_spin"
      # workspaces grown from a second thread while the calls run (quiesce.h)
      run_step harness_grow bash tests/cuda/run_overlap_harness.sh none "$OUT/harness_grow" --calls 8 --grow 12
      for kind in nccl cuda; do  # an injected failure per call: named, and the next call right
        run_step "harness_inject_$kind" bash tests/cuda/run_overlap_harness.sh none "$OUT/harness_inject_$kind" --inject "$kind" --ops ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g
      done ;;
    harness_peer)  # the peer-store calls without JAX, one rank its own peer (world 1, any GPU count):
      # RunGemmPeerReduce's frame, growth between calls, the watchdog's waits, a broken pair's refusal,
      # a failed growth's
      [[ -n "${harness_built:-}" ]] || { run_step harness_build bash tests/cuda/build_overlap_harness.sh && harness_built=1; }
      H=(env WORLD=1 bash tests/cuda/run_overlap_harness.sh)
      run_step hpeer "${H[@]}" none "$OUT/hpeer" --ops pr_rs,pr_ar --calls 4
      run_step hpeer_odd "${H[@]}" none "$OUT/hpeer_odd" --ops pr_rs,pr_ar --m 320 --n 272 --k 200
      run_step hpeer_waves "${H[@]}" none "$OUT/hpeer_waves" --ops pr_rs,pr_ar --m 4096 --n 1024 --k 256
      run_step hpeer_spin env JAX_FLASHOVERLAP_WAIT=spin "${H[@]}" none "$OUT/hpeer_spin" --ops pr_rs,pr_ar
      run_step hpeer_watchdog "${H[@]}" none "$OUT/hpeer_watchdog" --ops pr_rs,pr_ar,ar,rs --watchdog 30 --calls 3
      run_step hpeer_grow "${H[@]}" none "$OUT/hpeer_grow" --ops pr_rs,pr_ar,ar --calls 8 --grow 6
      run_step hpeer_inject_cuda "${H[@]}" none "$OUT/hpeer_inject_cuda" --inject cuda --ops pr_rs
      run_step hpeer_inject_nccl "${H[@]}" none "$OUT/hpeer_inject_nccl" --inject nccl --ops pr_ar
      # a failed growth of the buffers: the next call refused without breaking the pair, then regrown
      run_step hpeer_inject_grow "${H[@]}" none "$OUT/hpeer_inject_grow" --inject grow --ops pr_ar
      run_step hpeer_memcheck env SANITIZER_ARGS="--report-api-errors no" "${H[@]}" memcheck "$OUT/hpeer_san" --ops pr_rs,pr_ar --m 320 --n 272 --k 200 --calls 1 ;;
    sanitize_harness)  # the same under compute-sanitizer (small, unaligned shapes: the tools are slow)
      hargs=(--m 320 --n 272 --k 200 --calls 1 --ops "${HARNESS_SAN_OPS:-ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g}")
      for tool in memcheck racecheck synccheck; do
        run_step "hsan_$tool" bash tests/cuda/run_overlap_harness.sh "$tool" "$OUT/harness_san" "${hargs[@]}"
      done
      # memcheck again without CUDA API errors (NCCL's own probes): memory-access errors only
      run_step hsan_memcheck_noapi env SANITIZER_ARGS="--report-api-errors no" SANITIZER_TAG=_noapi bash tests/cuda/run_overlap_harness.sh memcheck "$OUT/harness_san" "${hargs[@]}"
      grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|SYNCCHECK SUMMARY" "$OUT"/harness_san/*.log > "$OUT/harness_sanitize_summary.txt" 2>&1 ;;
    gemm_epilogue)  # the default (overlapped) epilogue checked, and timed against FLASHOVERLAP_GEMM_EPILOGUE=sync
      # Standalone binaries: .build/ (tests/cuda/build.sh, built elsewhere and carried).
      find_cublas
      SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
      SYNC=(env FLASHOVERLAP_GEMM_EPILOGUE=sync)
      run_step ge_correctness .build/gemm_test correctness --json "$OUT/ge_correctness.json"
      run_step ge_signal .build/gemm_test signal --json "$OUT/ge_signal.json"
      run_step ge_ext .build/gemm_ext_test all --json "$OUT/ge_ext.json"
      for tool in memcheck racecheck synccheck; do
        run_step "ge_$tool" "$SAN" --tool "$tool" --error-exitcode 3 .build/gemm_test sanitize
      done
      run_step ge_bench_overlap .build/gemm_test bench --json "$OUT/ge_bench_overlap.json"
      run_step ge_bench_sync "${SYNC[@]}" .build/gemm_test bench --json "$OUT/ge_bench_sync.json"
      run_step ge_jax_overlap python3 -m jax_flashoverlap.bench gemm --comm-sms 0 8 16 --out "$OUT/gemm_h200.json"
      run_step ge_jax_sync "${SYNC[@]}" python3 -m jax_flashoverlap.bench gemm --comm-sms 0 8 16 --out "$OUT/gemm_sync_epilogue_h200.json" ;;
    transpose_w)  # w given as [N, K] (the _nk instances): every standalone check on that path, timed
      # against the [K, N] kernel and cuBLAS, then through JAX (ours in place vs XLA's x @ w.T
      # vs ours on a materialized w.T); .build/ as in gemm_epilogue.
      find_cublas
      SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
      NK=(env GEMM_TEST_TRANSPOSE_W=1)
      run_step tw_correctness "${NK[@]}" .build/gemm_test correctness --json "$OUT/tw_correctness.json"
      run_step tw_signal "${NK[@]}" .build/gemm_test signal --json "$OUT/tw_signal.json"
      run_step tw_ext "${NK[@]}" .build/gemm_ext_test all --json "$OUT/tw_ext.json"
      run_step tw_tests env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra tests/test_gpu_transpose_w.py
      run_step tw_bench_kn .build/gemm_test bench --json "$OUT/tw_bench_kn.json"
      run_step tw_bench_nk "${NK[@]}" .build/gemm_test bench --json "$OUT/tw_bench_nk.json"
      run_step tw_jax python3 -m jax_flashoverlap.bench gemm --transpose-w --comm-sms 0 8 16 ${TW_ARGS:-} --out "$OUT/gemm_transpose_w_h200.json"
      for tool in memcheck racecheck synccheck; do
        run_step "tw_$tool" "${NK[@]}" "$SAN" --tool "$tool" --error-exitcode 3 .build/gemm_test sanitize
      done ;;
    helpers)  # the helper launches (FLASHOVERLAP_GEMM_HELPERS): standalone checks, sanitizers,
      # bench beside emulated collectives, per-group timeline (.build/, as in gemm_epilogue),
      # then the harness's overlapped calls with helpers (needs the harness step's build)
      SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
      run_step helpers_check .build/gemm_helpers_test check --json "$OUT/helpers_check.json"
      for tool in memcheck racecheck synccheck; do
        run_step "helpers_$tool" "$SAN" --tool "$tool" --error-exitcode 3 .build/gemm_helpers_test sanitize
      done
      run_step helpers_bench .build/gemm_helpers_test bench --json "$OUT/helpers_bench.json"
      run_step helpers_timeline .build/gemm_helpers_test timeline
      run_step harness_helpers env FLASHOVERLAP_GEMM_HELPERS=on bash tests/cuda/run_overlap_harness.sh none "$OUT/harness_helpers" --calls 3 --m 2048 --n 1024 --k 512 --comm-sms 96 --ops ar,ar_out,rs ;;
    quickstart) run_step quickstart python3 examples/quickstart.py ;;
    launch_smoke)  # the launcher on this machine's GPUs: one process per GPU runs; one more is refused
      ngpu=$(gpu_count)
      run_step launch_all python3 -m jax_flashoverlap.launch -n "$ngpu" --gpus-per-process 1 --timeout 300 examples/quickstart.py
      # refused (exit 2) with the reason: that is this step's success
      run_step launch_too_many bash -c "python3 -m jax_flashoverlap.launch -n $((ngpu + 1)) --gpus-per-process 1 --timeout 60 examples/quickstart.py; rc=\$?; [ \$rc -eq 2 ] && echo 'refused as expected (exit 2)'"
      run_step jax_on_hidden_gpu env CUDA_VISIBLE_DEVICES="$ngpu" python3 -c "import jax; print(jax.default_backend(), jax.devices())" ;;
    bench_smoke)  # every bench subcommand end to end at a small shape (value checks included)
      run_step bench_gemm_smoke python3 -m jax_flashoverlap.bench gemm --shapes 4096x4096x4096 --world 1 --comm-sms 0 8 --samples 5 --calls 3 --out "$OUT/bench_gemm_smoke.json"
      run_step bench_overlap_smoke python3 -m jax_flashoverlap.bench overlap --shapes 4096x4096x4096 --samples 5 --calls 3 --trace 2 --out "$OUT/bench_overlap_smoke.json"
      run_step bench_a2a_smoke python3 -m jax_flashoverlap.bench a2a --shapes 4096x4096x4096 --samples 5 --calls 3 --out "$OUT/bench_a2a_smoke.json" ;;
    global_view) run_step global_view python3 examples/global_view_jit.py ;;
    a2a_tests)  # #9 ops (matmul_all_to_all, all_gather_matmul) on GPUs
      run_step a2a_tests env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -x -s -ra tests/test_gpu_a2a.py ;;
    diagnose)  # one call of each #9 op (and the all-reduce as a control): where a hang blocks
      for op in ${DIAGNOSE_OPS:-ar a2a ag}; do run_step "diagnose_$op" python3 scripts/diagnose_hang.py "$op" --wait 45; done ;;
    a2a_bench) run_step a2a_bench env JAX_FLASHOVERLAP_WATCHDOG_S=20 python3 -m jax_flashoverlap.bench a2a --out "$OUT/a2a_$TAG.json" ;;
    readme_tests) run_step readme_tests bash -c "bash scripts/setup_env.sh && bash scripts/run_tests.sh" ;;
    pack)  # the device tool returns at most 8 files: everything in one archive. Written
      # beside $OUT first: inside it, tar read its own growing archive ("file changed as we
      # read it", exit 1) and the files were never deleted.
      # Archive first, moved in, then the rest deleted: never the archive, once written.
      printf '%s\n' "${summary[@]}" > "$OUT/summary.txt"  # (archived with the logs)
      packed="$(mktemp "${TMPDIR:-/tmp}/fo_pack.XXXXXX")" && chmod 644 "$packed"
      archive="$OUT/session_$(date +%H%M%S).tgz"
      if ! { tar -czf "$packed" -C "$OUT" --exclude='*.tgz' . && mv "$packed" "$archive"; }; then
        rm -f "$packed"; failed=1
        summary+=("$(printf '%-14s rc=1   no archive: every file left in %s' pack "$OUT")")
      elif ! find "$OUT" -mindepth 1 ! -name '*.tgz' -delete 2>/dev/null; then
        summary+=("$(printf '%-14s rc=0   %s written; some files could not be deleted' pack "$archive")")
      else
        summary+=("$(printf '%-14s rc=0   %s' pack "$archive")")
      fi ;;
    cuda_tests) run_step cuda_tests bash tests/cuda/run_gpu.sh ;;
    peer_groups)  # one GPU is enough: groups of 3, 4 and 8 ranks emulated on it (each rank's GEMMs on
      # SMs / world), every result against float32 and the ring's rounded running sum bit for bit
      STEP_TIMEOUT="${STEP_TIMEOUT:-300}" run_step pr_groups .build/peer_reduce_test groups --json "$OUT/pr_groups.json" ;;
    peer_spin)  # one GPU is enough: two emulated ranks with spin-kernel waits (the watchdog's kind),
      # check then break; the break timed out in session 20 (the tests' emulated ranks did not
      # load the wait / write kernels up front: fixed in session 21)
      STEP_TIMEOUT=90 run_step pr_spin_check env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test check --json "$OUT/pr_spin_check.json"
      STEP_TIMEOUT=90 run_step pr_spin_break env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test break --json "$OUT/pr_spin_break.json" ;;
    peer)  # the peer-store transport (experimental; 2+ GPUs, one process or one each): its GPU
      # tests and the standalone checks (.build/ from tests/cuda/build_overlap_harness.sh); the
      # timings are peer_bench's (two steps: one device call of 600 s does not hold both)
      STEP_TIMEOUT="${STEP_TIMEOUT:-400}" gpu_pytest peer_tests tests/test_gpu_peer.py
      peer_programs ;;
    peer_programs)  # the standalone checks alone (gpu_part 3 runs tests/test_gpu_peer.py)
      peer_programs ;;
    peer_bench)  # the bench's ours_peer beside the NCCL path and XLA (one process, then one per
      # GPU under the launcher)
      run_step peer_bench python3 -m jax_flashoverlap.bench overlap --world 2 --variants peer --out "$OUT/peer_bench_$TAG.json"
      # the same with the other GPU granted access to XLA's memory (the all-reduce unstaged
      # where XLA left it out; its JSON's peer_communicators say which way each went)
      run_step peer_bench_granted env JAX_FLASHOVERLAP_GRANT_PEER_ACCESS=1 python3 -m jax_flashoverlap.bench overlap --world 2 --variants peer --collectives all_reduce --out "$OUT/peer_bench_granted_$TAG.json"
      run_step peer_bench_procs python3 -m jax_flashoverlap.launch -n 2 --gpus-per-process 1 --timeout 500 -m jax_flashoverlap.bench overlap --variants peer --out "$OUT/peer_bench_procs_$TAG.json" ;;
    peer_tune)  # tune --peer into $OUT only: a whole tune (call A's 400-550 s) of its own, after
      # peer_bench's three benches it never fitted one device call
      run_step peer_tune python3 -m jax_flashoverlap.tune --world 2 --peer ${TUNE_ARGS:-} --out "$OUT/peer_tuned_$TAG.json" --report "$OUT/peer_tune_$TAG.json" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
echo "==== summary"; printf '%s\n' "${summary[@]}"
# Exit 1 when a step failed (each step's rc is in the summary; the device scripts read it).
exit $failed
