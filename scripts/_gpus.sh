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
# gpu_model: the first GPU's model as result names spell it (NVIDIA H200 -> h200, NVIDIA H100
# 80GB HBM3 -> h100), "gpu" without one: a machine asked for as H200 may come with H100s.
gpu_model() {
  local m=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    m=$(nvidia-smi -L 2>/dev/null | sed -n '1s/^GPU 0: \(NVIDIA \)\{0,1\}\([A-Za-z0-9]*\).*/\2/p' | tr 'A-Z' 'a-z')
  fi
  echo "${m:-gpu}"
}
