"""Shared by the examples: which path a compiled program took, and why. The extension's general
status (`jax_flashoverlap.info()`) is not enough: over one device, or at a shape where the cost
model predicts no gain, an op compiles to XLA's own dot + collective."""

import jax

import jax_flashoverlap as fo


def uses_custom_call(compiled_text: str, collective: str) -> bool:
  return f"flashoverlap_gemm_{collective}" in compiled_text


def program_path(compiled_text: str, collective: str, m: int, n: int, k_local: int,
                 world: int) -> str:
  """One line for `compiled_text` (a compiled program's as_text()) of an op doing
  `collective` over `world` devices, per device an m x n x k_local GEMM."""
  if uses_custom_call(compiled_text, collective):
    return f"our custom call flashoverlap_gemm_{collective} (signaling GEMM + NCCL, overlapped)"
  xla = "XLA's dot + " + ("psum" if collective == "all_reduce" else "psum_scatter")
  status = fo.info()["paths"][f"matmul_{collective}"]
  if not status["cuda_custom_call"]:
    return f"{xla}: {status['why']}"
  if world == 1:
    return f"{xla} (one device: nothing to communicate)"
  plan = fo.plan.choose_plan(collective, m, n, k_local, world,
                             gpu=jax.devices()[0].device_kind)
  return (f"{xla} (the plan predicts no gain over XLA: {plan.predicted_s * 1e3:.3f} ms vs "
          f"{plan.baseline_s * 1e3:.3f} ms)")


def timing_note(custom_call: bool) -> str:
  return ("" if custom_call else "  (no custom call here: both run XLA's ops, so the "
          "difference is noise, not a speedup)")
