"""`jax_flashoverlap.info()` and `python -m jax_flashoverlap.info`: what is installed and
which path (CUDA custom calls or the reference composition) each op takes here, and why."""

from __future__ import annotations

import json
import platform
import sys

from jax_flashoverlap import _environment, _ext, _version

OP_TARGETS = {
    "matmul": "flashoverlap_gemm",
    "matmul_all_reduce": "flashoverlap_gemm_all_reduce",
    "matmul_reduce_scatter": "flashoverlap_gemm_reduce_scatter",
    "matmul_all_to_all": "flashoverlap_gemm_all_to_all",
    "all_gather_matmul": "flashoverlap_all_gather_gemm",
}


def info() -> dict:
  """Versions, build, GPU and the path each op takes on this machine (a JSON-able dict)."""
  import jax
  import jaxlib
  problems = []  # settings that do not parse: reported, not raised (info is for diagnosing)
  gpus = []
  try:
    gpus = [d.device_kind for d in jax.devices("gpu")]
  except RuntimeError:
    pass
  out = {
      "jax_flashoverlap": _version.__version__,
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "default_backend": jax.default_backend(),
      "gpus": gpus,
      "gpu_name": gpus[0] if gpus else None,
      "extension_built": _ext.HAS_CUDA_EXT,
      "extension_error": _ext.EXT_IMPORT_ERROR,
      "force_reference": _setting(_ext.force_reference, problems),
      "ffi_targets": sorted(_ext.available_targets()),
  }
  if _ext.ext is not None:
    out["build"] = dict(_ext.ext.build_info())
    try:
      out["nccl_version"] = _ext.ext.nccl_version()
    except Exception as err:  # NCCL missing at run time: report, do not fail
      out["nccl_version"] = f"unavailable ({err})"
  else:
    out["build"] = None
    out["nccl_version"] = None
  paths = {}
  for op, target in OP_TARGETS.items():
    use, why = _setting(lambda: _ext.check_cuda_path(target, gpu_present=bool(gpus)),
                        problems, (None, None))
    if use is None:
      why = f"not decided: {problems[-1]}"
    elif not gpus:
      use, why = False, f"no GPU: {op} lowers to the reference composition on {jax.default_backend()}"
    paths[op] = {"cuda_custom_call": use, "why": why}
  out["paths"] = paths
  out["settings"] = _settings(problems)
  out["tuned_configs"] = _tuned_configs(problems)
  out["invalid_settings"] = sorted(set(problems))
  out["unknown_variables"] = _environment.unknown_variables()
  return out


def _settings(problems) -> dict:
  """Every switch the ops read at lowering or setup, as parsed (each reader validates: a
  value the ops would refuse is reported here instead)."""
  from jax_flashoverlap import distributed, primitives
  readers = dict(primitives.switch_readers(),
                 kv_timeout_seconds=lambda: distributed.timeout_ms() / 1000,
                 # the launcher's variables, as initialize() would take them (None: unset)
                 launch=distributed.launch_settings)
  return {name: _setting(read, problems) for name, read in readers.items()}


def _tuned_configs(problems) -> dict:
  """The tuned-config files in effect (shipped, then the user's) and their entries, or the
  error the first plan lookup would raise (a file that does not validate, a config dir that
  is not one)."""
  from jax_flashoverlap import tuning
  try:
    on = _ext.env_switch(tuning.TUNED_ENV, True)
  except ValueError:  # reported with the settings
    on = True
  try:
    files = tuning.config_files()
    return {"files": [str(f) for f in files], "entries": len(tuning.load_all()),
            "user_dir": str(tuning.user_config_dir()), "in_use": on,
            # per file (its own entries, overridden ones included), how many were measured on
            # this kernel build ('current'), on another ('other': used, with a
            # KernelBuildWarning), do not say ('unrecorded'), or cannot be compared: no
            # extension ('unknown')
            "kernel_build": _ext.kernel_build(),
            "entries_by_kernel_build": tuning.kernel_builds_by_file(files)}
  except ValueError as err:
    if on:  # with JAX_FLASHOVERLAP_TUNED=0 no lookup reads them: shown, not a problem
      problems.append(str(err))
    return {"error": str(err), "in_use": on}


def _setting(read, problems, invalid=None):
  """read(), or `invalid` with the ValueError's message (a switch that does not parse, e.g.
  JAX_FLASHOVERLAP_FORCE_REFERENCE=ture) added to `problems`."""
  try:
    return read()
  except ValueError as err:
    problems.append(str(err))
    return invalid if invalid is not None else f"invalid: {err}"


def main(argv=None) -> int:
  """Prints info() as JSON; exit status 1 when a setting does not parse (the ops would raise
  on it at lowering) or a variable with the package's prefix is unknown (a misspelt switch,
  at its default), after naming each on stderr."""
  import argparse
  parser = argparse.ArgumentParser(
      prog="python -m jax_flashoverlap.info", allow_abbrev=False,
      description="Prints, as JSON, what is installed (versions, the CUDA extension's build and "
                  "kernel build, NCCL, the GPUs), which path each op takes here and why, every "
                  "switch as parsed and the tuned-config files in effect. Exit status 1 when a "
                  "setting does not parse or a variable with the package's prefix is one "
                  "nothing reads (named on stderr). Takes no options.")
  parser.parse_args(argv)  # --help; any other argument is an error, not silently ignored
  report = info()
  json.dump(report, sys.stdout, indent=2, default=str)
  sys.stdout.write("\n")
  for problem in report["invalid_settings"]:
    sys.stderr.write(f"jax_flashoverlap.info: invalid setting: {problem}\n")
  for problem in report["unknown_variables"]:
    sys.stderr.write(f"jax_flashoverlap.info: {problem}\n")
  return 1 if report["invalid_settings"] or report["unknown_variables"] else 0


if __name__ == "__main__":
  sys.exit(main())
