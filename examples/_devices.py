"""Shared start of the examples: with no GPU, simulate 8 CPU devices so the tensor-parallel
programs have a mesh to run on. Must run before jax is imported (XLA reads the flag once)."""

import os


def simulate_cpu_devices_without_gpu(count: int = 8) -> None:
  flags = os.environ.get("XLA_FLAGS", "")
  if not os.path.exists("/dev/nvidia0") and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def round_up(value: int, multiple: int) -> int:
  """value rounded up to a multiple of multiple: the examples' default sizes made to split
  over any device count (3 or 6 GPUs too), where a size the user gave is checked instead."""
  return -(-value // multiple) * multiple


def one_process_only() -> None:
  """The examples run in one process over every local device: under jax_flashoverlap.launch
  each process ran its own copy, none joined the others, and all exited 0 (call after
  simulate_cpu_devices_without_gpu: this imports jax)."""
  from jax_flashoverlap import distributed
  try:
    processes = distributed.launched_processes()
  except ValueError as err:  # the launcher's variable set by hand, not an integer
    raise SystemExit(str(err))
  if processes > 1:
    raise SystemExit(f"this example runs in one process over all local devices; under "
                     f"jax_flashoverlap.launch each of the {processes} processes would run a "
                     "copy of its own: run it without the launcher")
