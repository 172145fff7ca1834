"""Does an error returned by one of our FFI handlers come back as a Python exception, leaving
the process usable, or does it crash the process? Each case runs in its own child process (a
crash kills only the child); every case ends with a good call that must still work. Prints
one line per call and exits 1 when any case did not go as expected. For the GPU machine (#8;
tests/test_gpu_faults.py runs it).

  python scripts/diagnose_ffi_error.py [CASE ...]     (default: every case)

Cases (flashoverlap_gemm called through jax.ffi unless said otherwise):
  bad_attr_first       poison_outputs = 2 in the process's first execution
  bad_attr_after_good  the same after a good call of another program
  bad_sms_first        comm_sms = -1, first execution
  alias_then_bad       a poisoned call whose output aliases x (all NaN), then poison_outputs = 2
  ar_fault_first       matmul_all_reduce with an injected NCCL failure in its first execution
  ar_no_comm_ffi       flashoverlap_gemm_all_reduce through jax.ffi with an unknown comm_id
  ar_no_comm_prim      matmul_all_reduce (our lowering): a good call, destroy_communicators(),
                       call again (the handler finds no communicator)
  gemm_launch_error    fo.matmul (our lowering), FLASHOVERLAP_GEMM_EPILOGUE=snyc set after
                       compiling: the launcher refuses it after work was queued on the stream
  ar_comm_sms_differs  flashoverlap_gemm_all_reduce through jax.ffi on an existing communicator
                       with a comm_sms other than its CTA cap
  ar_bad_transport     the same call with transport = 2 (0: NCCL, 1: peer stores)
  ar_peer_one_rank     the same call with transport = 1 on a 1-rank communicator (peer stores
                       need 2 ranks)
  collective_bad_flag  flashoverlap_collective through jax.ffi with reduce_scatter = 2
With LD_PRELOAD=segv_backtrace.so (tests/cuda/segv_backtrace.c) a crashing child's native
stack is shown too.
"""
import subprocess
import sys

CHILD = r'''
import faulthandler, os, sys
faulthandler.enable()
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
from jax_flashoverlap import _ext
if jax.default_backend() != "gpu" or _ext.ext is None:
    print("NEEDS GPU: JAX's backend is %r, extension loaded: %s"
          % (jax.default_backend(), _ext.ext is not None), flush=True)
    sys.exit(3)
_ext.register_targets()
os.environ["JAX_FLASHOVERLAP_FALLBACK"] = "0"
case = sys.argv[1]
x = jax.random.normal(jax.random.key(0), (512, 512), jnp.bfloat16)
w = jax.random.normal(jax.random.key(1), (512, 512), jnp.bfloat16)

def gemm(poison=0, comm_sms=0, alias=False):
    out = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    f = jax.ffi.ffi_call("flashoverlap_gemm", out, input_output_aliases={0: 0} if alias else None)
    return jax.jit(lambda a, b: f(a, b, comm_sms=np.int32(comm_sms), num_groups=np.int32(4),
                                  transpose_w=np.int32(0), poison_outputs=np.int32(poison)))

def all_reduce():
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    return jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                                 in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))

def attempt(fn, *args):
    try:
        y = jax.block_until_ready(fn(*args))
        print("finite" if bool(jnp.all(jnp.isfinite(y))) else "nan", flush=True)
    except Exception as e:  # noqa: BLE001
        print("raised", type(e).__name__, str(e)[:300].replace("\n", " "), flush=True)

if case == "bad_attr_first":
    attempt(gemm(poison=2), x, w)
elif case == "bad_attr_after_good":
    attempt(gemm(), x, w)
    attempt(gemm(poison=2), x, w)
elif case == "bad_sms_first":
    attempt(gemm(comm_sms=-1), x, w)
elif case == "alias_then_bad":
    attempt(gemm(poison=1, alias=True), x + 0, w)
    attempt(gemm(poison=2), x, w)
elif case == "ar_fault_first":
    f = all_reduce()
    f.lower(x, w).compile()
    fo.comm.inject_faults("nccl", 1)
    attempt(f, x, w)
elif case == "ar_no_comm_ffi":
    out = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    f = jax.ffi.ffi_call("flashoverlap_gemm_all_reduce", out)
    attempt(jax.jit(lambda a, b: f(a, b, comm_id=np.int64(987654321), world_size=np.int32(1),
                                   comm_sms=np.int32(8), transpose_w=np.int32(0),
                                   poison_outputs=np.int32(0),
                                   band_rows=np.asarray([0, 512], np.int32),
                                   transport=np.int32(0), in_place=np.int32(0))), x, w)
elif case == "ar_no_comm_prim":
    f = all_reduce()
    attempt(f, x, w)
    fo.comm.destroy_communicators()
    attempt(f, x, w)
elif case == "gemm_launch_error":
    f = jax.jit(fo.matmul)
    f.lower(x, w).compile()
    os.environ["FLASHOVERLAP_GEMM_EPILOGUE"] = "snyc"
    attempt(f, x, w)
    del os.environ["FLASHOVERLAP_GEMM_EPILOGUE"]
elif case in ("ar_comm_sms_differs", "ar_bad_transport", "ar_peer_one_rank",
              "collective_bad_flag"):
    attempt(all_reduce(), x, w)  # makes the communicator
    (c,) = fo.comm.list_communicators()
    common = dict(comm_id=np.int64(c["comm_id"]), world_size=np.int32(1))
    out = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    if case != "collective_bad_flag":
        sms = c["comm_sms"] + (2 if case == "ar_comm_sms_differs" else 0)
        transport = {"ar_bad_transport": 2, "ar_peer_one_rank": 1}.get(case, 0)
        f = jax.ffi.ffi_call("flashoverlap_gemm_all_reduce", out)
        attempt(jax.jit(lambda a, b: f(a, b, comm_sms=np.int32(sms),
                                       transpose_w=np.int32(0), poison_outputs=np.int32(0),
                                       band_rows=np.asarray([0, 256 if transport == 1 else 512],
                                                            np.int32),
                                       transport=np.int32(transport), in_place=np.int32(0),
                                       **common)), x, w)
    else:
        f = jax.ffi.ffi_call("flashoverlap_collective", out)
        attempt(jax.jit(lambda a: f(a, reduce_scatter=np.int32(2), num_groups=np.int32(1),
                                    **common)), x)
attempt(gemm(), x, w)  # the process is still usable
attempt(all_reduce(), x, w)
print("child done", flush=True)
'''

# What each case must print, in order: its calls, then the two good calls at the end.
EXPECTED = {
    "bad_attr_first": ["raised"],
    "bad_attr_after_good": ["finite", "raised"],
    "bad_sms_first": ["raised"],
    "alias_then_bad": ["nan", "raised"],
    "ar_fault_first": ["raised"],
    "ar_no_comm_ffi": ["raised"],
    "ar_no_comm_prim": ["finite", "raised"],
    "gemm_launch_error": ["raised"],
    "ar_comm_sms_differs": ["finite", "raised"],
    "ar_bad_transport": ["finite", "raised"],
    "ar_peer_one_rank": ["finite", "raised"],
    "collective_bad_flag": ["finite", "raised"],
}


class NeedsGPU(Exception):
    pass


def run_case(case):
    """(ok, report lines) of one case in a child process."""
    r = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True,
                       timeout=240)
    if r.returncode == 3 and r.stdout.startswith("NEEDS GPU"):
        raise NeedsGPU(r.stdout.strip())
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    results = [ln for ln in r.stdout.splitlines() if ln.split(" ")[0] in ("finite", "nan",
                                                                          "raised")]
    want = EXPECTED[case] + ["finite", "finite"]
    ok = (r.returncode == 0 and [ln.split(" ")[0] for ln in results] == want
          and "child done" in r.stdout)
    report = [f"== {case}: exit {r.returncode}, {'as expected' if ok else 'NOT as expected'}"
              f" (want {want})"]
    native = [ln for ln in lines if ln.startswith(("native SIGSEGV", "  #"))][:40]
    shown = results + [ln for ln in lines if ln.startswith("Fatal")] + native or lines[-8:]
    return ok, report + ["    " + ln[:400] for ln in shown]


def main():
    cases = sys.argv[1:] or list(EXPECTED)
    if set(cases) & {"-h", "--help"}:
        print(__doc__)
        return 0
    unknown = [c for c in cases if c not in EXPECTED]
    if unknown:  # before any child runs (a typo was a KeyError after the first case)
        print(f"diagnose_ffi_error.py: unknown case(s) {', '.join(unknown)}; the cases: "
              + ", ".join(EXPECTED), file=sys.stderr)
        return 2
    bad = 0
    for case in cases:
        try:
            ok, report = run_case(case)
        except NeedsGPU as err:
            print(f"diagnose_ffi_error.py: runs our FFI handlers on a GPU ({err})",
                  file=sys.stderr)
            return 2
        bad += not ok
        print("\n".join(report), flush=True)
    print(f"{len(cases) - bad} of {len(cases)} cases as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
