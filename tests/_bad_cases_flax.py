"""Bad-input cases: the Flax layers, NNX and linen (rows of tests/test_bad_inputs.py)."""
from __future__ import annotations

from _bad_cases_common import *  # noqa: F401,F403  (the table's shared helpers)

# ----------------------------------------------------------------------------- Flax

def _nnx():
    from flax import nnx
    from jax_flashoverlap import flax as fl
    return nnx, fl


def _linen():
    from jax_flashoverlap import flax as fl
    return fl


def nnx_bad_reduce(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, reduce="all_gather", rngs=nnx.Rngs(0))


def nnx_sequence_dim_without_sequence_parallel(t):
    nnx, fl = _nnx()
    fl.ColumnParallelLinear(32, 64, sequence_dim=1, rngs=nnx.Rngs(0))


def nnx_column_reduce_scatter_with_sequence_dim(t):
    # a column layer reduces nothing: reduce= (and with it sequence_dim=1) was silently unused
    nnx, fl = _nnx()
    fl.ColumnParallelLinear(32, 64, reduce="reduce_scatter", sequence_dim=1, rngs=nnx.Rngs(0))


def nnx_inside_shard_map_without_its_axis(t):
    nnx, fl = _nnx()
    layer = fl.RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
    g, st = nnx.split(layer)
    jax.jit(jax.shard_map(lambda s, a: nnx.merge(g, s)(a), mesh=make_mesh_2d(2, 4),
                          in_specs=(P(), P("dp")), out_specs=P("dp"), axis_names={"dp"})
            ).trace(st, sds((8, 64)))


def nnx_rs_sequence_dim_not_leading(t):
    # x [8, 64] local [8, 16]: sequence_dim=1 is K, not a leading dim (the message used to say
    # dim 1 was not divisible by 4)
    nnx, fl = _nnx()
    layer = fl.RowParallelLinear(64, 32, reduce="reduce_scatter", sequence_dim=1,
                                 rngs=nnx.Rngs(0))
    g, st = nnx.split(layer)
    jax.jit(jax.shard_map(lambda s, a: nnx.merge(g, s)(a), mesh=make_mesh_1d(4),
                          in_specs=(nnx.get_partition_spec(st), P(None, "tp")),
                          out_specs=P())).trace(st, sds((8, 64)))


def nnx_in_features_not_divisible(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.RowParallelLinear(34, 16, rngs=nnx.Rngs(0))


def nnx_out_features_not_divisible(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.ColumnParallelLinear(32, 18, rngs=nnx.Rngs(0))


def nnx_mesh_arg_not_divisible(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(34, 16, mesh=make_mesh_1d(4), rngs=nnx.Rngs(0))  # mesh=, no set_mesh


def nnx_out_features_not_aligned(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 20, rngs=nnx.Rngs(0))  # N of the op: a multiple of 8


def nnx_local_in_features_not_aligned(t):
    nnx, fl = _nnx()
    gdef, state = nnx.split(fl.RowParallelLinear(80, 32, rngs=nnx.Rngs(0)))  # no mesh yet
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4),
                  (nnx.get_partition_spec(state), P(None, "tp")), P())
    jax.eval_shape(f, state, sds((8, 80)))  # 20 input features per device


def nnx_features_not_positive(t):
    nnx, fl = _nnx()
    fl.ColumnParallelLinear(0, 16, rngs=nnx.Rngs(0))


def nnx_dtype_float32(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, dtype=jnp.float32, rngs=nnx.Rngs(0))


def nnx_axis_not_str(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, axis_name=("tp",), rngs=nnx.Rngs(0))


def nnx_axis_unknown(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):  # the mesh has only 'tp'
        fl.RowParallelLinear(32, 16, axis_name="model", rngs=nnx.Rngs(0))


def nnx_x_shape_mismatch(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, rngs=nnx.Rngs(0))(jnp.ones((4, 24), BF16))


def nnx_global_params_in_shard_map(t):
    nnx, fl = _nnx()
    gdef, state = nnx.split(fl.RowParallelLinear(32, 16, rngs=nnx.Rngs(0)))
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4), (P(), P(None, "tp")), P())
    f(state, jnp.ones((4, 32), BF16))


def nnx_rs_rows_not_divisible(t):
    nnx, fl = _nnx()
    gdef, state = nnx.split(fl.RowParallelLinear(32, 16, reduce="reduce_scatter",
                                                 rngs=nnx.Rngs(0)))
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4),
                  (nnx.get_partition_spec(state), P(None, "tp")), P("tp"))
    jax.eval_shape(f, state, sds((6, 32)))


def linen_bad_reduce(t):
    fl = _linen()
    fl.RowParallelDense(16, reduce="bogus").init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_column_reduce(t):
    fl = _linen()
    fl.ColumnParallelDense(64, reduce="reduce_scatter", sequence_dim=1).init(
        jax.random.key(0), jnp.ones((2, 8, 32), BF16))


def linen_features_not_divisible(t):
    fl = _linen()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.ColumnParallelDense(18).init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_in_features_not_divisible(t):
    fl = _linen()
    mesh3 = Mesh(np.array(jax.devices("cpu")[:3]), ("tp",))
    with jax.set_mesh(mesh3):  # x has 32 input features; 32 % 3 != 0
        fl.RowParallelDense(16).init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_axis_unknown(t):
    fl = _linen()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.RowParallelDense(16, axis_name="model").init(jax.random.key(0),
                                                         jnp.ones((4, 32), BF16))


def linen_dtype_int8(t):
    fl = _linen()
    fl.RowParallelDense(16, dtype=jnp.int8).init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_x_rank0(t):
    # in_features comes from x's last dim: was an IndexError (jnp.shape(x)[-1])
    fl = _linen()
    fl.RowParallelDense(16).init(jax.random.key(0), jnp.ones((), BF16))


def linen_x_no_features(t):
    # x [4, 0]: was a ZeroDivisionError from the kernel's lecun_normal init (fan_in 0)
    fl = _linen()
    fl.ColumnParallelDense(16).init(jax.random.key(0), jnp.ones((4, 0), BF16))


def nnx_mesh_not_a_mesh(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, mesh="tp", rngs=nnx.Rngs(0))  # was an AttributeError


def nnx_mesh_abstract(t):
    # was JAX's TypeError about the params' device_put ("must be a NamedSharding ...")
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, mesh=make_mesh_1d(4).abstract_mesh, rngs=nnx.Rngs(0))


def nnx_param_dtype_not_a_dtype(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, param_dtype="flaot32", rngs=nnx.Rngs(0))  # numpy's bare error
