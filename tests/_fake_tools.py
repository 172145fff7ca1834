"""Stand-ins for the machine's tools in the tests of the shell scripts (setup_env.sh,
run_tests.sh, gpu_session.sh, runbook_call.sh): an nvidia-smi that lists GPUs."""
from __future__ import annotations

import pathlib


def nvidia_smi(gpus: int = 1, model: str = "NVIDIA H200", cuda: str | None = "13.0") -> str:
  """A fake nvidia-smi's script body (no #! line): `-L` lists `gpus` GPUs of `model`; any other
  call prints the table's header line, naming the CUDA release the driver runs (cuda None: a
  header without it)."""
  listed = "".join(f"echo 'GPU {i}: {model} (UUID: GPU-{i})'\n" for i in range(gpus))
  header = f"Driver Version: 580.95.05      CUDA Version: {cuda}" if cuda else "Driver Version: 580"
  return f"if [ \"$1\" = -L ]; then\n{listed}else\necho '| NVIDIA-SMI 580.95.05  {header} |'\nfi\n"


def write_nvidia_smi(folder: pathlib.Path, body: str) -> pathlib.Path:
  """folder/nvidia-smi, executable, running `body` (e.g. nvidia_smi()'s); the folder made."""
  folder.mkdir(parents=True, exist_ok=True)
  smi = folder / "nvidia-smi"
  smi.write_text("#!/bin/bash\n" + body)
  smi.chmod(0o755)
  return smi
