# Sourced by scripts/setup_env.sh, run_tests.sh and gpu_session.sh (from the checkout's root).
# gpu_count: how many GPUs `nvidia-smi -L` lists, 0 without nvidia-smi or a driver. grep -c
# reads all of nvidia-smi's output: `nvidia-smi -L | grep -q '^GPU'` stops at the first line
# and, under pipefail, an nvidia-smi still writing (SIGPIPE) read as "no GPU".
gpu_count() {
  local n=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || true
  fi
  echo "${n:-0}"
}
