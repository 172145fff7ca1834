"""Bad input raises a clear Python exception at trace time (jax.make_jaxpr, nothing compiled).

The message must name the offending argument ('x' or 'w', 'axis_name'/the axis, 'reduce') and say
what was expected; the checks are loose: one of the names as a word, plus one key word.
"""
import re

import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import make_mesh_1d, shard_map

BAD = (TypeError, ValueError)


def msg(names, keywords):
    """Regex for pytest.raises(match=...): one of `names` as a whole word AND one of `keywords`."""
    n = "|".join(re.escape(s) for s in names)
    k = "|".join(keywords)
    return rf"(?is)(?=.*(?<![A-Za-z0-9_])({n})(?![A-Za-z0-9_]))(?=.*({k}))"


def sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def trace_sharded(fo, name, x, w, n=2, axis="tp", x_spec=P(None, "tp"), w_spec=P("tp", None)):
    """Trace (only) a shard_map program over a 1-D 'tp' mesh calling collective op `name`."""
    mesh = make_mesh_1d(n)
    if name == "all_reduce":
        body, out = (lambda a, b: fo.matmul_all_reduce(a, b, axis)), P()
    else:
        body, out = (lambda a, b: fo.matmul_reduce_scatter(a, b, axis)), P("tp")
    return jax.make_jaxpr(shard_map(body, mesh, (x_spec, w_spec), out))(x, w)


def trace_plain(fo, x, w):
    return jax.make_jaxpr(fo.matmul)(x, w)


COLLECTIVES = ["all_reduce", "reduce_scatter"]
DTYPE_WORDS = ["dtype", "bfloat16", "float16", "bf16", "f16"]
SHAPE_WORDS = ["rank", "ndim", "dim", "2-?d", "shape", "matrix", "at least"]


# ------------------------------------------------------------------ dtype

@pytest.mark.parametrize("bad", [jnp.float32, jnp.int32], ids=["float32", "int32"])
@pytest.mark.parametrize("name", COLLECTIVES)
def test_unsupported_dtype_collectives(fo, name, bad):
    with pytest.raises(BAD, match=msg(["x", "w"], DTYPE_WORDS)):
        trace_sharded(fo, name, sds((4, 32), bad), sds((32, 16), bad))


@pytest.mark.parametrize("bad", [jnp.float32, jnp.int32], ids=["float32", "int32"])
def test_unsupported_dtype_matmul(fo, bad):
    with pytest.raises(BAD, match=msg(["x", "w"], DTYPE_WORDS)):
        trace_plain(fo, sds((4, 32), bad), sds((32, 16), bad))


@pytest.mark.parametrize("which", ["x", "w"])
def test_unsupported_dtype_names_the_argument(fo, which):
    """Only one argument is float32: the message names that one."""
    x = sds((4, 32), jnp.float32 if which == "x" else jnp.bfloat16)
    w = sds((32, 16), jnp.float32 if which == "w" else jnp.bfloat16)
    with pytest.raises(BAD, match=msg([which], DTYPE_WORDS + ["float32"])):
        trace_sharded(fo, "all_reduce", x, w)


@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_mixed_dtypes(fo, name):
    x, w = sds((4, 32), jnp.bfloat16), sds((32, 16), jnp.float16)
    with pytest.raises(BAD, match=msg(["x", "w"], DTYPE_WORDS + ["same", "match", "mix"])):
        if name == "matmul":
            trace_plain(fo, x, w)
        else:
            trace_sharded(fo, name, x, w)


# ------------------------------------------------------------------ shapes

@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_k_mismatch(fo, name):
    # per device on 2 devices: x [4, 16], w [24, 16]
    with pytest.raises(BAD, match=msg(["x", "w"], ["K", "contract", "match", "shape", "inner"])):
        if name == "matmul":
            trace_plain(fo, sds((4, 16)), sds((24, 16)))
        else:
            trace_sharded(fo, name, sds((4, 32)), sds((48, 16)))


@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_weight_rank_1(fo, name):
    with pytest.raises(BAD, match=msg(["w"], SHAPE_WORDS)):
        if name == "matmul":
            trace_plain(fo, sds((4, 32)), sds((32,)))
        else:
            trace_sharded(fo, name, sds((4, 32)), sds((32,)), w_spec=P("tp"))


@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_x_rank_1(fo, name):
    with pytest.raises(BAD, match=msg(["x"], SHAPE_WORDS)):
        if name == "matmul":
            trace_plain(fo, sds((32,)), sds((32, 16)))
        else:
            trace_sharded(fo, name, sds((32,)), sds((32, 16)), x_spec=P("tp"))


def test_reduce_scatter_m_not_divisible(fo):
    # 4 devices, M = 6 rows: 6 % 4 != 0
    with pytest.raises(BAD, match=msg(["x", "M"], ["divisib", "multiple", "divide"])):
        trace_sharded(fo, "reduce_scatter", sds((6, 64)), sds((64, 16)), n=4)


@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_n_not_multiple_of_8(fo, name):
    with pytest.raises(BAD, match=msg(["w", "N"], ["8"])):
        if name == "matmul":
            trace_plain(fo, sds((4, 32)), sds((32, 12)))
        else:
            trace_sharded(fo, name, sds((4, 32)), sds((32, 12)))


@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_k_not_multiple_of_8(fo, name):
    # per device K = 12
    with pytest.raises(BAD, match=msg(["x", "w", "K"], ["8"])):
        if name == "matmul":
            trace_plain(fo, sds((4, 12)), sds((12, 16)))
        else:
            trace_sharded(fo, name, sds((4, 24)), sds((24, 16)))


EMPTY = {  # global shapes on a 2-device mesh (K sharded); which argument must be named
    # (M = 0, x with no rows, is legal since session 40: tests/test_empty_rows.py)
    "K0": ((4, 0), (0, 16), ["x", "w", "K"]),
    "N0": ((4, 32), (32, 0), ["w", "N"]),
}


@pytest.mark.parametrize("case", list(EMPTY))
@pytest.mark.parametrize("name", COLLECTIVES + ["matmul"])
def test_empty_arrays(fo, name, case):
    xs, ws, names = EMPTY[case]
    if name == "reduce_scatter":
        xs = (8,) + xs[1:]
    with pytest.raises(BAD, match=msg(names, ["empty", "zero", "size", "positive", "non-?empty",
                                              r"\b0\b", "> ?0", ">= ?1"])):
        if name == "matmul":
            trace_plain(fo, sds(xs), sds(ws))
        else:
            trace_sharded(fo, name, sds(xs), sds(ws))


# ------------------------------------------------------------------ axis names

@pytest.mark.parametrize("name", COLLECTIVES)
def test_axis_name_not_bound_inside_shard_map(fo, name):
    # Our AxisNameError saying what is wrong, not JAX's own NameError("unbound axis name") nor
    # a later check's message (a loose match passed both when the "not bound" check was gone).
    with pytest.raises(fo.AxisNameError, match=r"matmul_\w+: axis_name 'nope' is not bound; "
                                               r"the bound axes are \('tp',\)"):
        trace_sharded(fo, name, sds((4, 32)), sds((32, 16)), axis="nope")


@pytest.mark.parametrize("name", COLLECTIVES)
def test_axis_name_outside_shard_map(fo, name):
    fn = fo.matmul_all_reduce if name == "all_reduce" else fo.matmul_reduce_scatter
    with pytest.raises(fo.AxisNameError, match=r"axis_name 'tp' is not bound; no axis is bound "
                                               r"here: call it inside jax.shard_map"):
        jax.make_jaxpr(lambda a, b: fn(a, b, "tp"))(sds((4, 32)), sds((32, 16)))


# ------------------------------------------------------------------ global view

def test_row_parallel_bad_reduce(fo):
    from jax.sharding import NamedSharding

    mesh = make_mesh_1d(2)
    x = jax.device_put(jnp.ones((4, 32), jnp.bfloat16), NamedSharding(mesh, P(None, "tp")))
    w = jax.device_put(jnp.ones((32, 16), jnp.bfloat16), NamedSharding(mesh, P("tp", None)))
    with pytest.raises(BAD, match=msg(["reduce"], ["bogus", "all_reduce", "reduce_scatter"])):
        jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce="bogus")).trace(x, w)


# ------------------------------------------------------------------ fault injection (testing hook)

@pytest.mark.parametrize("kind, calls, word", [("ncc", 1, "kind"), ("NCCL", 1, "kind"),
                                               ("nccl", -1, "calls"), ("cuda", 1.5, "calls"),
                                               ("cuda", True, "calls")])
def test_inject_faults_bad_arguments(fo, kind, calls, word):
    with pytest.raises(ValueError, match=msg([word], ["one of", ">= 0"])):
        fo.comm.inject_faults(kind, calls)


def test_inject_faults_without_extension_says_so(fo, monkeypatch):
    """Runs whether or not the extension is built here: the extension is hidden (as
    tests/test_trace.py's no_extension fixture does), so the check is not skipped where the
    .so exists (every GPU machine and most checkouts)."""
    from jax_flashoverlap import _ext
    monkeypatch.setattr(_ext, "ext", None)
    with pytest.raises(RuntimeError, match="inject_faults: the CUDA extension is not built"):
        fo.comm.inject_faults("nccl", 1)


def test_a_global_views_partitioner_axes_do_not_outlive_it(fo):
    """partitioner_axes (the global views' per-device lowering) counts the mesh axes as
    manual only inside it: afterwards a vmap axis of the same name is refused again, here and
    not by JAX later with a bare error."""
    from jax_flashoverlap import _validation
    with _validation.partitioner_axes(("tp",)):
        with _validation.partitioner_axes(("dp",)):
            pass
    w = jnp.ones((16, 8), jnp.bfloat16)
    f = jax.vmap(lambda a: fo.matmul_all_reduce(a, w, axis_name="tp"), axis_name="tp")
    with pytest.raises(fo.AxisNameError, match="no jax.shard_map encloses this call"):
        jax.make_jaxpr(f)(jnp.ones((2, 8, 16), jnp.bfloat16))
