"""The CPU lowering of the reducing ops (primitives.reduced_in_float32).

XLA's CPU compiler reduces a bfloat16 all-reduce / reduce-scatter in float32 itself; inside a
partly manual shard_map (axis_names a subset of the mesh's) that promotion aborts the process
(JAX 0.10: "Invalid binary instruction opcode copy"). Our CPU lowering promotes first: the
same bits as XLA's own op where XLA's works, and a result where XLA's would abort.
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import DTYPES, DTYPE_IDS, assert_rel_fro, f32, op_fn, rand, shard_map

ROOT = Path(__file__).resolve().parents[1]

on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu",
                            reason="checks the CPU lowering (on GPUs the ops run the kernels)")

_CASES = {  # name -> (x shape, w shape, x spec, w spec, out spec) on an 8-device 'tp' mesh
    "all_reduce": ((5, 8 * 40), (8 * 40, 24), P(None, "tp"), P("tp", None), P()),
    "reduce_scatter": ((8 * 3, 8 * 40), (8 * 40, 32), P(None, "tp"), P("tp", None), P("tp")),
}


@on_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(_CASES))
def test_same_bits_as_xla(fo, name, dtype, rng):
    """Eight ranks' partials (each a sum over 40 products, rounded) summed: any other order or
    precision of the reduction than XLA's shows in the last bits."""
    from _util import make_mesh_1d

    mesh = make_mesh_1d(8)
    xs, ws, x_spec, w_spec, out_spec = _CASES[name]
    x, w = rand(rng, xs, dtype), rand(rng, ws, dtype)
    op, ref = op_fn(fo, name, "tp")
    got = jax.jit(shard_map(op, mesh, (x_spec, w_spec), out_spec))(x, w)
    want = jax.jit(shard_map(ref, mesh, (x_spec, w_spec), out_spec))(x, w)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(f32(got), f32(want))


_PARTLY_MANUAL = textwrap.dedent("""
    import sys
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_flashoverlap as fo

    name, dtype, how = sys.argv[1], jnp.dtype(sys.argv[2]), sys.argv[3]
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    rng = np.random.default_rng(7)
    x, dx = (jnp.asarray(rng.standard_normal((8, 4 * 48), np.float32), dtype) for _ in "ab")
    w, dw = (jnp.asarray(rng.standard_normal((4 * 48, 64), np.float32), dtype) for _ in "ab")
    op = {"all_reduce": fo.matmul_all_reduce, "reduce_scatter": fo.matmul_reduce_scatter,
          "all_gather": fo.all_gather_matmul}[name]
    # all_gather: x's rows and w's columns split over tp, the product's columns too
    (x_spec, w_spec), out_spec = {"all_reduce": ((P(None, "tp"), P("tp", None)), P()),
                                  "reduce_scatter": ((P(None, "tp"), P("tp", None)), P("tp")),
                                  "all_gather": ((P("tp"), P(None, "tp")), P(None, "tp"))}[name]
    x32, w32, dx32, dw32 = (np.asarray(a, np.float32) for a in (x, w, dx, dw))
    cot = rng.standard_normal((x.shape[0], w.shape[1]), np.float32)
    if how == "value":
        body, args, want = (lambda a, b: op(a, b, "tp")), (x, w), [x32 @ w32]
    elif how == "jvp":  # forward mode: the tangent is the reference's own collective
        body = lambda a, b, da, db: jax.jvp(lambda u, v: op(u, v, "tp"), (a, b), (da, db))[1]
        args, want = (x, w, dx, dw), [dx32 @ w32 + x32 @ dw32]
    else:  # reverse mode: the transposed collectives (all_gather's: a reduce-scatter of dx)
        body, args, want = (lambda a, b: op(a, b, "tp")), (x, w), [cot @ w32.T, x32.T @ cot]
    specs = (x_spec, w_spec) * (len(args) // 2)
    mapped = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec,
                           axis_names={"tp"})
    f = mapped if how != "grad" else jax.grad(
        lambda a, b: jnp.sum(mapped(a, b).astype(jnp.float32) * cot), argnums=(0, 1))
    got = jax.jit(f)(*args)
    for g, want in zip(got if how == "grad" else [got], want):
        g = np.asarray(g, np.float32)
        assert g.shape == want.shape, (g.shape, want.shape)
        err = np.linalg.norm(g - want) / np.linalg.norm(want)
        print(f"rel_fro {err:.2e}")
        assert err < 1e-2, err
    print("OK")
""")


@on_cpu
@pytest.mark.parametrize("how", ["value", "jvp", "grad"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", [*_CASES, "all_gather"])
def test_partly_manual_shard_map(name, dtype, how):
    """The per-device op with its axis among the shard_map's axis_names (what the global
    view's error inside such a shard_map tells users to do): right values, and right
    tangents and gradients (computed by the reference's own collectives, promoted on CPU as
    the forward is: a bfloat16 all_gather_matmul's gradient aborted the process), in a
    subprocess, since XLA's failure there aborts the process rather than raising."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _PARTLY_MANUAL, name, jnp.dtype(dtype).name,
                           how],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.returncode, proc.stdout,
                                                          proc.stderr[-3000:])


@on_cpu
@pytest.mark.parametrize("op_name", ["all_reduce", "reduce_scatter"])
def test_grads_under_vmap_with_an_spmd_axis_name(fo, op_name, rng):
    """`vmap(shard_map(...), spmd_axis_name="dp")`: the gradient raised "Expected cotangent
    type bfloat16[1,16,16] but got bfloat16[1,16,16]{V:dp}" (JAX's transpose of the cond that
    picked the CPU promotion); in a fully manual shard_map the derivative is XLA's own
    composition, with no cond, and equals XLA's gradient."""
    from jax import lax
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    x, w = rand(rng, (2, 16, 128), jnp.bfloat16), rand(rng, (128, 16), jnp.bfloat16)
    ours = {"all_reduce": lambda a, b: fo.matmul_all_reduce(a, b, "tp"),
            "reduce_scatter": lambda a, b: fo.matmul_reduce_scatter(a, b, "tp")}[op_name]
    xla = {"all_reduce": lambda a, b: lax.psum(a @ b, "tp"),
           "reduce_scatter": lambda a, b: lax.psum_scatter(a @ b, "tp", tiled=True)}[op_name]
    out_spec = P() if op_name == "all_reduce" else P("tp")
    cot = jnp.asarray(np.random.default_rng(3).standard_normal((2, 16, 16)), jnp.float32)

    def grads(body):
        f = jax.vmap(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                                   out_specs=out_spec), in_axes=(0, None), spmd_axis_name="dp")
        loss = lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * cot)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    for got, want in zip(grads(ours), grads(xla)):
        assert got.dtype == want.dtype == jnp.bfloat16
        np.testing.assert_array_equal(f32(got), f32(want))


@on_cpu
@pytest.mark.parametrize("variable,value", [
    ("JAX_FLASHOVERLAP_FORCE_REFERENCE", "ture"), ("JAX_FLASHOVERLAP_TRANSPORT", "nvlink"),
    ("FLASHOVERLAP_GEMM_EPILOGUE", "snyc"), ("JAX_FLASHOVERLAP_WAIT", "spinn"),
    ("JAX_FLASHOVERLAP_TUNED", "banana"), ("FLASHOVERLAP_TRACE", "banana"),
    ("JAX_FLASHOVERLAP_WATCHDOG_S", "abc"), ("JAX_FLASHOVERLAP_CONFIG_DIR", "/no/such/dir")])
@pytest.mark.parametrize("name", ["all_reduce", "matmul"])
def test_a_misspelt_switch_is_an_error_on_cpu_too(fo, monkeypatch, rng, name, variable, value):
    """The CUDA lowering refuses a switch that does not parse; the CPU lowering never read
    them, so a typo passed silently until the program reached a GPU."""
    from _util import make_mesh_1d

    monkeypatch.setenv(variable, value)
    jax.clear_caches()  # switches are read at lowering: a program lowered before is cached
    mesh = make_mesh_1d(2)
    x, w = rand(rng, (8, 64), jnp.bfloat16), rand(rng, (64, 16), jnp.bfloat16)
    op, _ = op_fn(fo, name, "tp")
    specs = ((P(None, "tp"), P("tp", None)), P()) if name == "all_reduce" else \
        ((P("tp", None), P()), P("tp", None))
    with pytest.raises(ValueError, match=rf"{variable}.*{re.escape(repr(value))}"):
        jax.jit(shard_map(op, mesh, *specs))(x, w)



def _manual_body(text):
    """The lines of a shard_map's body (sdy.manual_computation's region) in StableHLO text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "sdy.manual_computation" in line)
    end = next(i for i in range(start, len(lines)) if "sdy.return" in lines[i])
    body = "\n".join(lines[start + 1:end])
    assert body.strip(), text
    return body


@on_cpu
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_the_reference_body_carries_no_sharding_of_the_outer_mesh(fo, name, rng):
    """Inside a shard_map manual over 'tp' of a mesh whose 'dp' is explicit, JAX annotates
    each op of the body with the mixed mesh's sharding (the premise: XLA's psum(x @ w) there
    gets constraints), the scalar add of the collective's reduction too, which XLA's CPU
    compiler refused on JAX 0.11 ("Unsupported reduction computation";
    benchmarks/results/logs/cpu_suite_jax0112_h100x1/). Our reference lowering is one
    device's program, traced with every axis manual: no constraint in the shard_map's body,
    and right values (XLA's own program is only lowered: in bfloat16 here it aborts the
    process, module doc). JAX 0.11 constrains the shard_map's result outside the body (for
    ours too), and cannot lower XLA's own psum_scatter there at all ("Length of
    sharding.spec (2) must be equal to aval's ndim (0)", benchmarks/results/logs/
    jax0112_h100x1_947521d/), which ours then does."""
    from jax.sharding import AxisType, NamedSharding
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2,
                         devices=jax.devices()[:8])
    x = jax.device_put(rand(rng, (16, 64), jnp.bfloat16), NamedSharding(mesh, P(None, "tp")))
    w = jax.device_put(rand(rng, (64, 24), jnp.bfloat16), NamedSharding(mesh, P("tp", None)))
    out_spec = P() if name == "all_reduce" else P("tp")
    texts = {}
    for who, body in zip(("ours", "xla"), op_fn(fo, name)):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                                  out_specs=out_spec, axis_names={"tp"}))
        with jax.sharding.set_mesh(mesh):
            try:
                texts[who] = _manual_body(f.lower(x, w).as_text())
            except ValueError as e:  # XLA's own psum_scatter on JAX 0.11 (docstring)
                assert who == "xla" and name == "reduce_scatter", e
                assert "Length of sharding.spec" in str(e), e
                texts[who] = None
            if who == "ours":
                out = f(x, w)
    assert texts["xla"] is None or "sharding_constraint" in texts["xla"], \
        "premise: no mixed mesh here"
    assert "all_reduce" in texts["ours"] or "reduce_scatter" in texts["ours"], texts["ours"]
    assert "sharding_constraint" not in texts["ours"], texts["ours"]
    assert_rel_fro(out, f32(x) @ f32(w))  # 'dp' not manual: the body sees all 16 rows
