"""Bad-input cases of the command lines that are files, not modules: benchmarks/stress.py,
benchmarks/fuzz.py and the GPU diagnosis scripts in scripts/, plus the bench's launcher check
(rows of tests/test_bad_inputs.py, in _bad_rows_tools.py). Each was a traceback, a crash after
the work or a vacuous "OK" before."""
from __future__ import annotations

import uuid

from _bad_cases_common import *  # noqa: F401,F403  (the table's shared helpers)


def run_script(path, *args, timeout=120, **env):
    """`python <repo>/<path> args...` on CPU; env: extra variables (None: unset)."""
    full = dict(cli_env(), **{k: v for k, v in env.items() if v is not None})
    for name in [k for k, v in env.items() if v is None]:
        full.pop(name, None)
    return subprocess.run([sys.executable, os.path.join(REPO, path), *args], cwd=REPO,
                          env=full, capture_output=True, text=True, timeout=timeout)


def cli_bench_plot_unknown_format(t):
    # matplotlib refused '.xyz' after every row was measured ("complete": false)
    return run_cli("jax_flashoverlap.bench", "overlap", "--shapes", "64x64x64", "--samples",
                   "1", "--calls", "1", "--plot", str(t.tmp_path / "p.xyz"))


def cli_bench_plot_without_matplotlib(t):
    # the whole run was measured, then "matplotlib is not installed: no plot" and exit 0
    hidden = t.tmp_path / "no_matplotlib" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    env = cli_env()
    env["PYTHONPATH"] = str(hidden.parent) + os.pathsep + env["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "jax_flashoverlap.bench", "overlap", "--shapes",
                           "64x64x64", "--samples", "1", "--calls", "1", "--plot",
                           str(t.tmp_path / "p.png")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def cli_bench_coordinator_without_port(t):
    # an IndexError from inside jax.distributed.initialize (and info said nothing was wrong)
    env = dict(cli_env(), JAX_FLASHOVERLAP_COORDINATOR="localhost",
               JAX_FLASHOVERLAP_NUM_PROCESSES="2", JAX_FLASHOVERLAP_PROCESS_ID="0")
    return subprocess.run([sys.executable, "-m", "jax_flashoverlap.bench", "overlap", "--shapes",
                           "64x64x64"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def cli_bench_launcher_variables_partial(t):
    # a traceback from distributed.initialize (tune made it a usage error already)
    env = dict(cli_env(), JAX_FLASHOVERLAP_NUM_PROCESSES="2")
    return subprocess.run([sys.executable, "-m", "jax_flashoverlap.bench", "gemm", "--shapes",
                           "64x64x64"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def cli_stress_zero_calls(t):
    # ran nothing and printed "OK: no mismatch"
    return run_script("benchmarks/stress.py", "--calls", "0")


def cli_stress_dim_not_multiple_of_8(t):
    # a traceback from the scan model, after part 1 had run
    return run_script("benchmarks/stress.py", "--dim", "60")


def cli_stress_out_a_directory(t):
    # IsADirectoryError after part 1, and a stray <dir>.tmp<pid> file beside it
    return run_script("benchmarks/stress.py", "--out", str(t.tmp_path))


def cli_stress_seed_too_large(t):
    return run_script("benchmarks/stress.py", "--seed", "99999999999999999")


def cli_fuzz_ops_need_two_devices(t):
    # the ops left for one device were none: ZeroDivisionError
    return run_script("benchmarks/fuzz.py", "--cases", "2", "--ops", "all_to_all", "all_gather",
                      XLA_FLAGS="--xla_force_host_platform_device_count=1")


def cli_fuzz_seconds_nan(t):
    # wrote "seconds": NaN, which is not JSON
    return run_script("benchmarks/fuzz.py", "--cases", "2", "--seconds", "nan")


def cli_diagnose_hang_wait_infinite(t):
    return run_script("scripts/diagnose_hang.py", "ar", "--wait", "inf")


_HANG_CHILD = """
import os, sys, time
if os.environ.get("FO_DIAGNOSE_MARKER") and "-c" in sys.orig_argv:  # the child, not the script
    time.sleep(300)
"""


def cli_diagnose_hang_without_nvidia_smi(t):
    """Its child outlived it when nvidia-smi was missing (FileNotFoundError before the kill).
    The child (`python -c ...`) is made to hang by a sitecustomize here, whatever the
    machine's speed, and found afterwards by a marker in its environment."""
    marker = uuid.uuid4().hex
    (t.tmp_path / "sitecustomize.py").write_text(_HANG_CHILD)
    try:
        r = run_script("scripts/diagnose_hang.py", "ar", "--wait", "6", timeout=60,
                       PATH=os.path.dirname(sys.executable), FO_DIAGNOSE_MARKER=marker,
                       PYTHONPATH=str(t.tmp_path) + os.pathsep + cli_env()["PYTHONPATH"])
    finally:  # (a child left holding the pipes times the run out: it is stopped here too)
        time.sleep(0.5)
        left = [pid for pid in _pids_with(marker) if pid != os.getpid()]
        for pid in left:
            os.kill(pid, 9)
    assert not left, f"the child {left} outlived diagnose_hang.py:\n{r.stdout}{r.stderr}"
    return r


def _pids_with(marker: str) -> list:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def cli_diagnose_ffi_unknown_case(t):
    # a KeyError after the first case's child had run
    return run_script("scripts/diagnose_ffi_error.py", "bad_attr_first", "nope")


def cli_diagnose_ffi_without_gpu(t):
    # "0 of 1 cases as expected": failures reported where the handlers never ran
    return run_script("scripts/diagnose_ffi_error.py", "bad_attr_first")


def cli_first_call_overlap_without_gpu(t):
    # computed for ~20 s, then IndexError: no trace records off GPU
    return run_script("scripts/first_call_overlap.py")


def cli_gemm_in_jax_calls_0(t):
    # UnboundLocalError after every shape was measured
    return run_script("benchmarks/gemm_in_jax.py", "--calls", "0")


def cli_gemm_in_jax_without_gpu(t):
    # ran its GPU-sized GEMMs on the CPU for minutes, then wrote "device": "cpu"
    return run_script("benchmarks/gemm_in_jax.py", "--shapes", "64x64x64")


def cli_epilogue_ab_without_gpu(t):
    # new script: refuses before any work (on CPU fo.matmul is XLA's dot, no epilogue)
    return run_script("benchmarks/epilogue_ab.py", "--shapes", "64x64x64",
                      FLASHOVERLAP_GEMM_EPILOGUE=None)


def cli_epilogue_ab_epilogue_env_set(t):
    # new script: it sets the variable per variant, so a value given would be overwritten
    return run_script("benchmarks/epilogue_ab.py", FLASHOVERLAP_GEMM_EPILOGUE="sync")


def cli_xla_dot_profile_without_gpu(t):
    # compiled and ran the dot, then OSError: libcuda.so.1
    return run_script("benchmarks/xla_dot_profile.py", "64x64x64")


def cli_compile_variants_m_not_splittable(t):
    # a child's traceback after both processes had started
    return run_script("benchmarks/compile_variants.py", "--m", "63")


def cli_trace_op_calls_0(t):
    return run_script("benchmarks/trace_op.py", "--calls", "0")


def _bash(script, *args, **env):
    full = dict(cli_env(), **env)
    return subprocess.run(["/bin/bash", os.path.join(REPO, script), *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=60)


def cli_profile_gemms_without_arguments(t):
    # "$1: unbound variable"; without ncu it wrote a file named '*.txt' and went on
    return _bash("benchmarks/profile_gemms.sh")


def cli_ncu_ab_without_out(t):
    # bash's "OUT: set OUT ..." with exit 1, unlike the script's other usage errors (2)
    return _bash("benchmarks/ncu_ab.sh", OUT="")


def cli_ncu_ab_without_ncu(t):
    # printed 16 empty result rows and exited 0
    return _bash("benchmarks/ncu_ab.sh", OUT=str(t.tmp_path), PATH=str(t.tmp_path))  # no ncu
