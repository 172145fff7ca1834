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
# driver_cuda_major: the newest CUDA major release the driver runs (nvidia-smi's header says
# "CUDA Version: 13.0": 13), empty without nvidia-smi or where it says none; bounded, as a
# driver that hangs must not hang the setup.
driver_cuda_major() {
  local v=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    v=$(timeout 60 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version *: *\([0-9][0-9]*\)\..*/\1/p') || true
  fi
  echo "${v%%$'\n'*}"
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
