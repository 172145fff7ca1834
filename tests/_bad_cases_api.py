"""Bad-input cases: the public ops, the global view, non-contiguous / donated inputs (rows of
tests/test_bad_inputs.py; the Flax layers' cases are in _bad_cases_flax.py)."""
from __future__ import annotations

from jax_flashoverlap import _compat, _ext  # noqa: F401
from _bad_cases_common import *  # noqa: F401,F403  (the table's shared helpers)

# ----------------------------------------------------------------------------- public ops

def op_float32(t):
    trace_op("all_reduce", sds((8, 64), jnp.float32), sds((64, 32), jnp.float32))


def op_int8(t):
    trace_op("reduce_scatter", sds((8, 64), jnp.int8), sds((64, 32), jnp.int8))


def op_w_float32(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32), jnp.float32))


def op_mixed(t):
    trace_op("matmul", sds((8, 64)), sds((64, 32), F16))


def op_weak_both(t):  # jax.ShapeDtypeStruct's weak_type: x @ w of two weak bfloat16 is float32
    trace_op("all_reduce", jax.ShapeDtypeStruct((8, 64), BF16, weak_type=True),
             jax.ShapeDtypeStruct((64, 32), BF16, weak_type=True))


def op_x_rank1(t):
    trace_op("all_reduce", sds((64,)), sds((64, 32)), x_spec=P("tp"))


def _export_with_symbolic_rows(fn, mesh, x_spec, w_spec):
    """jax.export of fn(x, w) with x's rows a symbolic dimension 'b' (shape polymorphism)."""
    from jax import export
    (b,) = export.symbolic_shape("b")
    args = (jax.ShapeDtypeStruct((b, 64), BF16, sharding=NamedSharding(mesh, x_spec)),
            jax.ShapeDtypeStruct((64, 32), BF16, sharding=NamedSharding(mesh, w_spec)))
    export.export(jax.jit(fn))(*args)


def op_symbolic_dimension(t):
    # int() of the symbolic dim: JAX's InconclusiveDimensionOperation, naming no op
    mesh = make_mesh_1d(4)
    _export_with_symbolic_rows(shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh,
                                         (P(None, "tp"), P("tp", None)), P()),
                               mesh, P(None, "tp"), P("tp", None))


def rp_symbolic_dimension(t):
    mesh = make_mesh_1d(4)
    _export_with_symbolic_rows(lambda a, b: fo.row_parallel_matmul(a, b), mesh, P(None, "tp"),
                               P("tp", None))


def op_w_rank3(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32, 8)), w_spec=P("tp", None, None))


def op_rs_x_rank3_dim_not_divisible(t):
    # x [B=3, S=8, K] per device: S scattered over 4 devices works, B (the default) does not
    trace_op("reduce_scatter", sds((3, 8, 64)), sds((64, 32)), x_spec=P(None, None, "tp"))


def op_rs_x_rank1(t):
    trace_op("reduce_scatter", sds((64,)), sds((64, 32)), x_spec=P("tp"))


def op_k_mismatch(t):
    trace_op("all_reduce", sds((8, 64)), sds((96, 32)))  # local K 16 vs 24


def op_n_not_multiple_of_8(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 12)))


def op_k_not_multiple_of_8(t):
    trace_op("all_reduce", sds((8, 48)), sds((48, 32)))  # local K = 12


def op_empty_x(t):
    # K = 0 (rows with no elements); no rows (M = 0) is a legal input: test_empty_rows.py
    trace_op("all_reduce", sds((8, 0)), sds((0, 32)))


def op_empty_w(t):
    trace_op("matmul", sds((8, 64)), sds((64, 0)))


def op_rs_m_not_divisible(t):
    trace_op("reduce_scatter", sds((6, 64)), sds((64, 32)))


def op_axis_unbound(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), axis="nope")


def op_axis_outside_shard_map(t):
    jax.make_jaxpr(lambda a, b: fo.matmul_all_reduce(a, b, "tp"))(sds((8, 16)), sds((16, 32)))


def op_axis_not_str(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), axis=("tp", 3))


def op_axis_empty(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 32)), axis=())


def op_axis_repeated(t):
    """An axis named twice (JAX said only "repeated axis in `source` argument")."""
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), axis=("tp", "tp"))


def op_axis_repeated_all_to_all(t):
    mesh = make_mesh_2d(2, 4)
    body = lambda a, b: fo.matmul_all_to_all(a, b, ("dp", "tp", "dp"))  # noqa: E731
    jax.make_jaxpr(shard_map(body, mesh, (P(("dp", "tp")), P()), P(("dp", "tp"))))(
        sds((64, 16)), sds((16, 32)))


def op_axis_vmap_name(t):
    mesh = make_mesh_1d(4)

    def body(x, w):
        return jax.vmap(lambda r: fo.matmul_all_reduce(r, w, "b"), axis_name="b")(x)

    jax.make_jaxpr(shard_map(body, mesh, (P(None, None, "tp"), P("tp", None)), P()))(
        sds((2, 8, 64)), sds((64, 32)))


def _vmap_axis_outside_shard_map(op):
    """A vmap axis name as axis_name, no shard_map around (JAX gave a bare AssertionError or
    NameError, deep inside its psum / all_gather)."""
    w = jnp.ones((16, 32), BF16)
    body = {"all_reduce": lambda r: fo.matmul_all_reduce(r, w, "i"),
            "all_gather": lambda r: fo.all_gather_matmul(r, w, "i"),
            "all_to_all": lambda r: fo.matmul_all_to_all(r, w, "i")}[op]
    jax.jit(jax.vmap(body, axis_name="i"))(jnp.ones((4, 8, 16), BF16))


def op_axis_vmap_outside_shard_map(t):
    _vmap_axis_outside_shard_map("all_reduce")


def op_axis_vmap_outside_shard_map_all_gather(t):
    _vmap_axis_outside_shard_map("all_gather")


def op_axis_vmap_outside_shard_map_all_to_all(t):
    _vmap_axis_outside_shard_map("all_to_all")


def op_axis_vmap_named_like_mesh_axis(t):
    """Under jax.set_mesh the vmap axis 'tp' has a mesh axis' name, but no shard_map makes it
    manual: still a vmap axis."""
    w = jnp.ones((16, 32), BF16)
    with jax.set_mesh(make_mesh_1d(4)):
        jax.jit(jax.vmap(lambda r: fo.matmul_reduce_scatter(r, w, "tp"), axis_name="tp"))(
            jnp.ones((4, 8, 16), BF16))


def op_comm_sms_str(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), comm_sms="8")


def op_comm_sms_bool(t):
    trace_op("matmul", sds((8, 64)), sds((64, 32)), comm_sms=True)


def op_comm_sms_range(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 32)), comm_sms=131)


def op_x_not_array(t):
    fo.matmul([[1.0] * 8], jnp.ones((8, 8), BF16))


def op_transpose_w_int(t):
    trace_op("all_reduce", sds((8, 64)), sds((32, 64)), w_spec=P(None, "tp"), transpose_w=1)


def op_return_gathered_not_bool(t):
    # an int would silently decide how many results come back
    f = shard_map(lambda a, b: fo.all_gather_matmul(a, b, "tp", return_gathered=1),
                  make_mesh_1d(4), (P("tp", None), P(None, "tp")), P(None, "tp"))
    jax.make_jaxpr(f)(sds((16, 64)), sds((64, 32)))


def op_transpose_w_given_k_n(t):
    # w passed as [K, N] (local (16, 32)) with transpose_w=True, which reads it as [N, K]
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), transpose_w=True)


def op_w_given_n_k(t):
    # an [out, in] weight (local (32, 16)) passed without transpose_w=True
    trace_op("all_reduce", sds((8, 64)), sds((32, 64)), w_spec=P(None, "tp"))


def op_transpose_w_rank3(t):
    trace_op("matmul", sds((8, 64)), sds((32, 64, 8)), transpose_w=True)


def op_transpose_w_n_not_multiple_of_8(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((12, 64)), w_spec=P(None, "tp"),
             transpose_w=True)


# ----------------------------------------------------------------------------- global view

def rp_bad_reduce(t):
    jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce="all_gather")).trace(
        sds((16, 64)), sds((64, 32)))


def rp_axis_not_str(t):
    jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, axis_name=("tp",))).trace(
        sds((16, 64)), sds((64, 32)))


def rp_x_rank1(t):
    jax.jit(fo.row_parallel_matmul).trace(sds((64,)), sds((64, 32)))


def rp_transpose_w_not_bool(t):
    jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, transpose_w="yes")).trace(
        sds((16, 64)), sds((32, 64)))


def rp_axis_unknown(t):
    row_parallel(*rp_inputs(make_mesh_1d(4)), axis_name="model")


def rp_axis_unknown_under_set_mesh(t):
    # the mesh is known at trace time: the error comes before XLA partitions anything
    with jax.set_mesh(make_mesh_1d(4)):
        jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, axis_name="model")).trace(
            sds((16, 64)), sds((64, 32)))


def rp_k_two_axes(t):
    mesh = make_mesh_2d(2, 4)
    row_parallel(*rp_inputs(mesh, x_spec=P(None, ("dp", "tp")), w_spec=P(("dp", "tp"), None)))


def rp_rs_m_not_divisible(t):
    row_parallel(*rp_inputs(make_mesh_1d(4), x_shape=(6, 64)), reduce="reduce_scatter")


def rp_local_k_not_multiple_of_8(t):
    # global K = 40 is a multiple of 8, but each of the 8 shards holds K = 5
    row_parallel(*rp_inputs(make_mesh_1d(8), x_shape=(8, 40), w_shape=(40, 16)))


def rp_mesh_mismatch(t):
    devices = jax.devices("cpu")
    mesh_a = Mesh(np.array(devices[:4]), ("tp",))
    mesh_b = Mesh(np.array(devices[4:8]), ("tp",))
    row_parallel(put(rand((16, 64)), mesh_a, P(None, "tp")),
                 put(rand((64, 32)), mesh_b, P("tp", None)))


def rp_vmapped_over_w(t):
    mesh = make_mesh_1d(4)
    x, w = put(rand((16, 64)), mesh, P(None, "tp")), put(rand((3, 64, 32)), mesh,
                                                         P(None, "tp", None))
    jax.jit(jax.vmap(fo.row_parallel_matmul, in_axes=(None, 0)))(x, w)


def cp_vmapped_over_w(t):
    mesh = make_mesh_1d(4)
    x, w = put(rand((3, 16, 64)), mesh, P(None, "tp", None)), put(rand((3, 64, 32)), mesh,
                                                                  P(None, None, "tp"))
    jax.jit(jax.vmap(jax.jit(fo.column_parallel_matmul)))(x, w)


def _in_shard_map(fn, mesh, in_specs, out_specs, **kw):
    jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)).trace(
        sds((16, 64)), sds((64, 32)))


def rp_inside_shard_map(t):
    # fully manual, check_vma off: before, each device silently computed its local dot
    _in_shard_map(lambda a, b: fo.row_parallel_matmul(a, b, "all_reduce", "tp"),
                  make_mesh_1d(4), (P(None, "tp"), P("tp", None)), P(), check_vma=False)


def cp_inside_shard_map(t):
    _in_shard_map(lambda a, b: fo.column_parallel_matmul(a, b, "tp"), make_mesh_1d(4),
                  (P("tp"), P(None, "tp")), P(None, "tp"))


def rp_inside_partly_manual_shard_map(t):
    # manual over dp only (tp left to XLA): before, an AssertionError inside XLA's partitioner
    _in_shard_map(lambda a, b: fo.row_parallel_matmul(a, b, "all_reduce", "tp"),
                  make_mesh_2d(2, 4), (P("dp"), P()), P("dp"), axis_names={"dp"})


def _column_parallel(x, w, **kw):
    return jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, **kw))(x, w)


def cp_axis_unknown(t):
    _column_parallel(*rp_inputs(make_mesh_1d(4), x_spec=P("tp", None), w_spec=P(None, "tp")),
                     axis_name="model")


def cp_n_two_axes(t):
    mesh = make_mesh_2d(2, 4)
    _column_parallel(*rp_inputs(mesh, x_spec=P("tp", None), w_spec=P(None, ("dp", "tp"))))


def cp_sequence_dim_not_leading(t):
    # x [S, B, K]: leading dims 0 and 1; 2 is K
    mesh = make_mesh_1d(4)
    _column_parallel(*rp_inputs(mesh, x_shape=(16, 2, 64), w_shape=(64, 32),
                                x_spec=P("tp", None, None), w_spec=P(None, "tp")),
                     sequence_dim=2)


def cp_local_n_not_multiple_of_8(t):
    # global N = 40 is a multiple of 8, but each of the 8 shards holds N = 5
    _column_parallel(*rp_inputs(make_mesh_1d(8), x_shape=(16, 64), w_shape=(64, 40),
                                x_spec=P("tp", None), w_spec=P(None, "tp")))


def rp_w_sharded_on_other_axis(t):
    """w sharded on 'dp' while x's K is sharded on 'tp': legal; XLA reshards w. The values
    are XLA's psum / psum_scatter over 'tp' of each device's x @ w (XLA's own global
    x @ w may partition otherwise: on JAX 0.11 its last bits differ)."""
    mesh = make_mesh_2d(2, 4)
    x, w = rp_inputs(mesh, x_spec=P(None, "tp"), w_spec=P("dp", None))
    specs = (P(None, "tp"), P("tp", None))
    w_tp = jax.device_put(w, NamedSharding(mesh, specs[1]))
    refs = {"all_reduce": shard_map(lambda a, b: lax.psum(a @ b, "tp"), mesh, specs, P()),
            "reduce_scatter": shard_map(lambda a, b: lax.psum_scatter(
                a @ b, "tp", scatter_dimension=0, tiled=True), mesh, specs, P("tp", None))}
    return [(row_parallel(x, w, reduce=r), jax.jit(ref)(x, w_tp)) for r, ref in refs.items()]


# ----------------------------------------------------------------------------- non-contiguous

def _ours_and_psum(x, w, mesh):
    specs = (P(None, "tp"), P("tp", None)), P()
    ours = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh, *specs))
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a @ b, "tp"), mesh, *specs))
    return ours(x, w), ref(x, w)


def noncontig_transposed(t):
    """x = xt.T and w = wt.T: JAX arrays have no strides, a transpose is a new dense array."""
    mesh = make_mesh_1d(4)
    xt, wt = rand((64, 16)), rand((32, 64), seed=1)
    pairs = [_ours_and_psum(xt.T, wt.T, mesh)]
    # the transpose inside the jitted per-device function (XLA may fold it into the dot)
    specs = (P("tp", None), P(None, "tp")), P()
    ours = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a.T, b.T, "tp"), mesh, *specs))
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a.T @ b.T, "tp"), mesh, *specs))
    pairs.append((ours(xt, wt), ref(xt, wt)))
    return pairs


def noncontig_sliced(t):
    """Strided and offset slices (x[::2, 8:72], w[:, 1::2]) as inputs."""
    mesh = make_mesh_1d(4)
    big_x, big_w = rand((32, 80)), rand((64, 64), seed=1)
    x, w = big_x[::2, 8:72], big_w[:, 1::2]
    assert x.shape == (16, 64) and w.shape == (64, 32)
    return [_ours_and_psum(x, w, mesh)]


# ----------------------------------------------------------------------------- donation

def donated_reuse(t):
    """A donated input is deleted by JAX; passing it to our op again is JAX's own error."""
    mesh = make_mesh_1d(4)
    specs = (P(None, "tp"), P("tp", None)), P()  # local x [16, 8] == local out [16, 8]
    body = lambda a, b: fo.matmul_all_reduce(a, b, "tp")  # noqa: E731
    x, w = put(rand((16, 32)), mesh, specs[0][0]), put(rand((32, 8), seed=1), mesh, specs[0][1])
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a @ b, "tp"), mesh, *specs))(x, w)
    y = jax.jit(shard_map(body, mesh, *specs), donate_argnums=0)(x, w)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))
    assert x.is_deleted(), "the donated buffer was not consumed: the case tests nothing"
    # a fresh jit of our op (calling the same jitted function again: next case)
    jax.jit(shard_map(body, mesh, *specs))(x, w)


_DONATE_SCRIPT = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    specs = (P(None, "tp"), P("tp", None)), P()
    x = jax.device_put(jnp.ones((16, 32), jnp.bfloat16), NamedSharding(mesh, specs[0][0]))
    w = jax.device_put(jnp.ones((32, 8), jnp.bfloat16), NamedSharding(mesh, specs[0][1]))
    f = jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                              in_specs=specs[0], out_specs=specs[1]), donate_argnums=0)
    f(x, w)
    assert x.is_deleted()
    f(x, w)  # the same jitted function again, with the donated (deleted) array
''')


def donated_reuse_same_function(t):
    script = t.tmp_path / "donate.py"
    script.write_text(_DONATE_SCRIPT)
    return subprocess.run([sys.executable, str(script)], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
