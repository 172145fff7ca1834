"""Child process of tests/test_gpu_cache.py and tests/test_compile_cache.py: one overlapped
all-reduce over every local device, compiled through JAX's persistent compilation cache or
through a serialized executable. Prints one JSON line (the last) with what it saw.

    python tests/_cache_child.py MODE WORKDIR

MODE:
  cache       compile with the persistent cache in WORKDIR/cache; report the cache's hits and
              misses during that compile, whether the compiled program calls our custom call,
              and the result's error against float32.
  cache_global  the same with the global view `row_parallel_matmul` under plain jit.
  guard       the test suite's shared cache (tests/conftest.py): with
              `_compat.persistent_cache_skips_custom_partitioning()` in place (unless WORKDIR
              ends in "unguarded"), compile the all-reduce program, then the global view, each
              twice with jax.clear_caches() between: each compile's hits and misses, and the
              cache's entries after each program.
  reuse       no guard: compile the global view 30 times with jax.clear_caches() between and
              count the cache's hits (each one an id JAX's key holds that came back: README).
  lower_cuda  cross-lower each op for CUDA (a mesh of the local devices, abstract DESIGN.md-size
              inputs; nothing compiled): {op: StableHLO text}, what the cache key hashes.
  serialize   compile, write the serialized executable and the inputs and result to WORKDIR.
  load        load that executable in this fresh process (nothing lowered here) and call it:
              report the error it raises (none of the lowering's communicators exist here).
  lower_load  lower the same function first (which makes the communicators), then load and
              call: report its result against the one the serializing process computed.
  destroy     call, comm.destroy_communicators(), call again (the error), lower the same
              function again (JAX's cached lowering: still none), jax.clear_caches() and call:
              the handler's advice followed, step by step.
"""
import json
import os
import pickle
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import CACHE_HITS, CACHE_MISSES, compile_events, use_persistent_cache

M, N, K = 1024, 2048, 2048
TARGET = "flashoverlap_gemm_all_reduce"


def _program(global_view=False):
    import jax_flashoverlap as fo
    from _util import shard_map
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    if global_view:
        return mesh, jax.jit(fo.row_parallel_matmul)
    f = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=24), mesh,
                          (P(None, "tp"), P("tp", None)), P()))
    return mesh, f


def _inputs(mesh):
    kx, kw = jax.random.split(jax.random.PRNGKey(int.from_bytes(os.urandom(4), "little")))
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) * K ** -0.5).astype(jnp.bfloat16)
    return _placed(mesh, x, w)


def _placed(mesh, x, w):
    return (jax.device_put(x, NamedSharding(mesh, P(None, "tp"))),
            jax.device_put(w, NamedSharding(mesh, P("tp", None))))


def _rel_err(y, x, w):
    ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32),
                     precision=lax.Precision.HIGHEST)
    y = jnp.asarray(y, jnp.float32)
    return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def cache(workdir, global_view=False):
    use_persistent_cache(os.path.join(workdir, "cache"))
    events = compile_events()
    mesh, f = _program(global_view)
    x, w = _inputs(mesh)
    events.clear()  # count only the program's compile, not the inputs'
    compiled = f.lower(x, w).compile()
    seen = list(events)
    y = compiled(x, w)
    return {"hits": seen.count(CACHE_HITS),
            "misses": seen.count(CACHE_MISSES),
            "custom_call": TARGET in compiled.as_text(),
            "finite": bool(jnp.all(jnp.isfinite(y))), "rel_err": _rel_err(y, x, w)}


def guard(workdir):
    from jax_flashoverlap import _compat
    installed = (not workdir.endswith("unguarded")
                 and _compat.persistent_cache_skips_custom_partitioning())
    path = os.path.join(workdir, "cache")
    use_persistent_cache(path)
    events = compile_events()
    seen = {"installed": installed}
    for name, global_view in (("plain", False), ("global", True)):
        mesh, f = _program(global_view)
        x, w = _inputs(mesh)
        compiles = []
        for _ in range(2):
            jax.clear_caches()  # JAX's in-memory caches: the next compile asks the persistent one
            events.clear()
            f.lower(x, w).compile()
            compiles.append([events.count(CACHE_HITS), events.count(CACHE_MISSES)])
        seen[name] = compiles
        seen[name + "_entries"] = len(os.listdir(path)) if os.path.isdir(path) else 0
    return seen


def reuse(workdir):
    import gc
    use_persistent_cache(os.path.join(workdir, "cache"))
    events = compile_events()
    mesh, _ = _program(global_view=True)
    x, w = _inputs(mesh)
    hits = 0
    for _ in range(30):
        jax.clear_caches()
        gc.collect()  # frees the last lowering's callback object: its id may be given again
        events.clear()
        _program(global_view=True)[1].lower(x, w).compile()  # a new jit each time, as a user's
        hits += events.count(CACHE_HITS)
    return {"compiles": 30, "hits": hits}


def serialize(workdir):
    from jax.experimental import serialize_executable as se
    mesh, f = _program()
    x, w = _inputs(mesh)
    compiled = f.lower(x, w).compile()
    with open(os.path.join(workdir, "executable.pkl"), "wb") as fh:
        pickle.dump(se.serialize(compiled), fh)
    y = compiled(x, w)
    np.savez(os.path.join(workdir, "values.npz"), x=np.asarray(x, np.float32),
             w=np.asarray(w, np.float32), y=np.asarray(y, np.float32))
    return {"custom_call": TARGET in compiled.as_text(), "rel_err": _rel_err(y, x, w)}


def _load(workdir):
    from jax.experimental import serialize_executable as se
    with open(os.path.join(workdir, "executable.pkl"), "rb") as fh:
        payload, in_tree, out_tree = pickle.load(fh)
    values = np.load(os.path.join(workdir, "values.npz"))
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    x, w = _placed(mesh, *(jnp.asarray(values[k], jnp.bfloat16) for k in ("x", "w")))
    return (lambda: se.deserialize_and_load(payload, in_tree, out_tree)), x, w, values["y"]


def load(workdir):
    import jax_flashoverlap  # noqa: F401  (as a user of our ops has: registers the handlers)
    loaded, x, w, _ = _load(workdir)
    try:
        y = np.asarray(loaded()(x, w))
        error = None
    except Exception as e:  # noqa: BLE001  (what the user sees is the point)
        y, error = None, f"{type(e).__name__}: {e}"
    after = float(jnp.sum(jnp.ones(8)))  # the process goes on computing after the error
    return {"error": error, "finite": None if y is None else bool(np.all(np.isfinite(y))),
            "after": after}


def lower_load(workdir):
    loaded, x, w, y_then = _load(workdir)
    _, f = _program()
    f.lower(x, w)  # lowering makes this process's communicators (comm_id is a stable hash)
    y = loaded()(x, w)
    return {"max_abs_diff": float(np.max(np.abs(np.asarray(y, np.float32) - y_then))),
            "rel_err": _rel_err(y, x, w)}


def _error_of(call):
  try:
    call()
    return None
  except Exception as e:  # noqa: BLE001  (what the user sees is the point)
    return f"{type(e).__name__}: {e}"


def destroy(_):
  from jax_flashoverlap import comm
  mesh, f = _program()
  x, w = _inputs(mesh)
  before = _rel_err(f(x, w), x, w)
  comm.destroy_communicators()
  error = _error_of(lambda: f(x, w).block_until_ready())
  f.lower(x, w)  # the same function lowered again: JAX gives its cached lowering back
  error_after_lower = _error_of(lambda: f(x, w).block_until_ready())
  jax.clear_caches()
  return {"before": before, "error": error, "error_after_lower": error_after_lower,
          "after_clear_caches": _rel_err(f(x, w), x, w)}


def lower_cuda(_):
    import jax_flashoverlap as fo
    from _util import shard_map
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    M, K, N = 4096, 8192, 8192
    x, w = jax.ShapeDtypeStruct((M, K), jnp.bfloat16), jax.ShapeDtypeStruct((K, N), jnp.bfloat16)
    rows, cols, whole = P("tp", None), P(None, "tp"), P()
    programs = {  # op: (per-device function, in_specs, out_specs)
        "matmul": (fo.matmul, (rows, whole), rows),
        "all_reduce": (lambda a, b: fo.matmul_all_reduce(a, b, "tp"), (cols, rows), whole),
        "reduce_scatter": (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), (cols, rows), rows),
        "all_to_all": (lambda a, b: fo.matmul_all_to_all(a, b, "tp"), (rows, whole), rows),
        "all_gather": (lambda a, b: fo.all_gather_matmul(a, b, "tp"), (rows, cols), cols),
    }
    return {op: jax.jit(shard_map(fn, mesh, ins, out)).trace(x, w)
            .lower(lowering_platforms=("cuda",)).as_text()
            for op, (fn, ins, out) in programs.items()}


if __name__ == "__main__":
    mode, workdir = sys.argv[1], sys.argv[2]
    print(json.dumps({"cache": cache, "cache_global": lambda d: cache(d, global_view=True),
                      "guard": guard, "reuse": reuse, "serialize": serialize, "load": load,
                      "lower_load": lower_load, "lower_cuda": lower_cuda,
                      "destroy": destroy}[mode](workdir)))
