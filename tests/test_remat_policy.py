"""jax_flashoverlap.ops_as_dots: jax.checkpoint policies that see the ops as their GEMMs.

JAX's dot-based policies keep dot_general's results only; our op (GEMM + collective, one
primitive inside a custom_jvp) was recomputed in the backward under them, one GEMM and one
collective more per op than XLA's psum(x @ w) under the same policy (which keeps its dot).
`ops_as_dots(policy)` asks the policy about each op as that dot. Counted here in the
differentiated program's jaxpr: binds of our primitive (2 = forward + recomputed).
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from _util import make_mesh_1d, rand, shard_map

N = 4
BF16 = jnp.bfloat16
policies = jax.checkpoint_policies


def _cases(fo):
    """name -> (op, primitive name, x spec, w spec, x shape, w shape), per device shapes
    chosen so every op lowers (reference path on CPU)."""
    return {
        "matmul": (lambda x, w: fo.matmul(x, w), "flashoverlap_gemm",
                   P(), P(), (32, 64), (64, 48)),
        "all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                       "flashoverlap_gemm_all_reduce", P(None, "tp"), P("tp", None),
                       (32, 64 * N), (64 * N, 48)),
        "reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
                           "flashoverlap_gemm_reduce_scatter", P(None, "tp"), P("tp", None),
                           (32, 64 * N), (64 * N, 48)),
        "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
                       "flashoverlap_gemm_all_to_all", P(), P(), (32 * N, 64), (64, 48)),
        "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                       "flashoverlap_all_gather_gemm", P("tp", None), P(), (32 * N, 64),
                       (64, 48)),
        "all_reduce_transpose_w": (
            lambda x, w: fo.matmul_all_reduce(x, w, "tp", transpose_w=True),
            "flashoverlap_gemm_all_reduce", P(None, "tp"), P(None, "tp"), (32, 64 * N),
            (48, 64 * N)),
    }


def _grad_program(op, x_spec, w_spec, policy):
    """(loss, dw) of sum(tanh(op(x, w))) per device, the op under jax.checkpoint(policy)
    (None: no checkpoint). The loss is kept, as in a training step: with jax.grad alone the
    forward's op would be dead code (its only use the loss) and XLA would drop it."""
    def loss(x, w):
        block = lambda x, w: jnp.sum(jnp.tanh(op(x, w)).astype(jnp.float32))  # noqa: E731
        if policy is not None:
            block = jax.checkpoint(block, policy=policy)
        return block(x, w)
    def step(x, w):  # each device's loss, stacked over tp: some ops' outputs vary there
        value, dw = jax.value_and_grad(loss, argnums=1)(x, w)
        return value[None], dw
    return jax.jit(shard_map(step, make_mesh_1d(N), (x_spec, w_spec), (P("tp"), w_spec)))


def _binds(fn, args, name):
    return str(jax.make_jaxpr(fn)(*args)).count(name + "[")


def _abstract(xs, ws):
    return jax.ShapeDtypeStruct(xs, BF16), jax.ShapeDtypeStruct(ws, BF16)


@pytest.mark.parametrize("case", ["matmul", "all_reduce", "reduce_scatter", "all_to_all",
                                  "all_gather", "all_reduce_transpose_w"])
@pytest.mark.parametrize("policy", ["dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_dot_policies_keep_the_op_instead_of_recomputing_it(fo, case, policy):
    op, name, xsp, wsp, xs, ws = _cases(fo)[case]
    base = getattr(policies, policy)
    args = _abstract(xs, ws)
    assert _binds(_grad_program(op, xsp, wsp, base), args, name) == 2  # the premise
    assert _binds(_grad_program(op, xsp, wsp, fo.ops_as_dots(base)), args, name) == 1


@pytest.mark.parametrize("policy,binds", [("nothing_saveable", 2), ("everything_saveable", 1)])
def test_policies_that_do_not_look_at_dots_are_unchanged(fo, policy, binds):
    op, name, xsp, wsp, xs, ws = _cases(fo)["all_reduce"]
    base = getattr(policies, policy)
    args = _abstract(xs, ws)
    for p in (base, fo.ops_as_dots(base)):
        assert _binds(_grad_program(op, xsp, wsp, p), args, name) == binds


def test_names_policies_still_see_names(fo):
    """A name policy is asked about name_p as before: a checkpoint_name on the op's result
    keeps it, with or without the wrapper; the unnamed op is recomputed."""
    op, name, xsp, wsp, xs, ws = _cases(fo)["all_reduce"]
    named = lambda x, w: checkpoint_name(op(x, w), "y")  # noqa: E731
    args = _abstract(xs, ws)
    keep_y = policies.save_only_these_names("y")
    assert _binds(_grad_program(named, xsp, wsp, fo.ops_as_dots(keep_y)), args, name) == 1
    assert _binds(_grad_program(op, xsp, wsp, fo.ops_as_dots(keep_y)), args, name) == 2


@pytest.mark.parametrize("case", ["all_reduce", "reduce_scatter", "all_gather",
                                  "all_reduce_transpose_w"])
def test_gradients_equal_the_unchecked_program(fo, rng, case):
    op, _, xsp, wsp, xs, ws = _cases(fo)[case]
    x, w = rand(rng, xs, BF16), rand(rng, ws, BF16)
    want = np.asarray(_grad_program(op, xsp, wsp, None)(x, w)[1], np.float32)
    got = np.asarray(
        _grad_program(op, xsp, wsp, fo.ops_as_dots(policies.dots_saveable))(x, w)[1],
        np.float32)
    assert np.isfinite(got).all() and np.abs(got).max() > 0
    np.testing.assert_array_equal(got, want)


def test_the_policy_is_asked_about_the_dot_the_op_computes(fo):
    """With transpose_w the dot contracts w's last dim: the policy sees dot_general with
    x's and w's avals and those dimension numbers (and for a plain dot, dim 0 of w)."""
    seen = []

    def recording(prim, *avals, **params):
        if prim is lax.dot_general_p:
            seen.append((tuple(a.shape for a in avals), params["dimension_numbers"]))
        return False

    for case, contract in (("all_reduce", 0), ("all_reduce_transpose_w", 1)):
        op, _, xsp, wsp, xs, ws = _cases(fo)[case]
        seen.clear()
        jax.make_jaxpr(_grad_program(op, xsp, wsp, fo.ops_as_dots(recording)))(
            *_abstract(xs, ws))
        per_device = ((xs[0], xs[1] // N), (ws[0] // N, ws[1]) if contract == 0
                      else (ws[0], ws[1] // N))
        assert (per_device, (((1,), (contract,)), ((), ()))) in seen, seen


def test_the_overlapped_backward_layers_too(fo):
    """The Flax layers' matmuls (layer_backward, a custom_vjp around the op): the reduce-
    scatter forward is kept under dots_saveable with the wrapper, recomputed without."""
    from jax_flashoverlap import layer_backward
    op = lambda x, w: layer_backward.row_scatter_matmul(x, w, "tp", 0)  # noqa: E731
    args = _abstract((32, 64 * N), (64 * N, 48))
    name = "flashoverlap_gemm_reduce_scatter"
    base = policies.dots_saveable
    assert _binds(_grad_program(op, P(None, "tp"), P("tp", None), base), args, name) == 2
    assert _binds(_grad_program(op, P(None, "tp"), P("tp", None), fo.ops_as_dots(base)),
                  args, name) == 1


def test_wrapped_policies_are_hashable_and_equal(fo):
    a, b = fo.ops_as_dots(policies.dots_saveable), fo.ops_as_dots(policies.dots_saveable)
    assert a == b and hash(a) == hash(b)
    assert fo.ops_as_dots(a) is a  # wrapping twice changes nothing
    assert a != fo.ops_as_dots(policies.nothing_saveable)


def test_a_policy_that_is_not_callable_is_a_type_error(fo):
    with pytest.raises(TypeError, match="ops_as_dots: policy must be a jax.checkpoint policy"):
        fo.ops_as_dots("dots_saveable")


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_linen_remat_of_a_block_with_the_row_layer(fo, rng, reduce):
    """nn.remat(block, policy=ops_as_dots(dots_saveable)) of a linen block (RowParallelDense,
    then tanh, whose backward needs the layer's result) inside shard_map: the op is bound
    once in the gradient's program (twice with the policy alone: recomputed), and the
    gradients equal the block's without remat."""
    nn = pytest.importorskip("flax.linen")
    from jax_flashoverlap.flax import RowParallelDense

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return jnp.tanh(RowParallelDense(48, reduce=reduce)(x))

    mesh = make_mesh_1d(N)
    x = rand(rng, (16, 64 * N), BF16)
    variables = Block().init(jax.random.key(0), x)
    pspecs = nn.get_partition_spec(variables)["params"]
    params = nn.unbox(variables)["params"]
    name = "flashoverlap_gemm_" + reduce

    def grads(block):
        def loss(p, x):
            return jnp.sum(block.apply({"params": p}, x).astype(jnp.float32))
        def step(p, x):  # each device's loss, stacked over tp
            value, grads = jax.value_and_grad(loss)(p, x)
            return value[None], grads
        return jax.jit(shard_map(step, mesh, (pspecs, P(None, "tp")), (P("tp"), pspecs)))

    want = jax.tree.map(lambda a: np.asarray(a, np.float32), grads(Block())(params, x))
    counts = {}
    for label, policy in (("base", policies.dots_saveable),
                          ("wrapped", fo.ops_as_dots(policies.dots_saveable))):
        block = nn.remat(Block, policy=policy)()
        counts[label] = _binds(grads(block), (params, x), name)
        got = jax.tree.map(lambda a: np.asarray(a, np.float32), grads(block)(params, x))
        jax.tree.map(np.testing.assert_array_equal, got, want)
    assert counts == {"base": 2, "wrapped": 1}, counts


def test_nnx_remat_of_a_block_with_the_row_layer(fo, rng):
    """nnx.remat(policy=ops_as_dots(dots_saveable)) of an NNX block (RowParallelLinear, then
    tanh) inside shard_map: one bind of the op in the gradient (two with the policy alone),
    gradients bit for bit with the block's without remat."""
    nnx = pytest.importorskip("flax.nnx")
    from jax_flashoverlap.flax import RowParallelLinear

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.layer = RowParallelLinear(64 * N, 48, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.layer(x))

    mesh = make_mesh_1d(N)
    x = rand(rng, (16, 64 * N), BF16)
    graph, state = nnx.split(Block(nnx.Rngs(0)))
    specs = nnx.get_partition_spec(state)

    def grads(policy):
        def loss(state, x):
            block = nnx.merge(graph, state)
            call = (lambda b, x: b(x)) if policy is None else nnx.remat(
                lambda b, x: b(x), policy=policy)
            return jnp.sum(call(block, x).astype(jnp.float32))
        def step(p, x):  # each device's loss, stacked over tp
            value, grads = jax.value_and_grad(loss)(p, x)
            return value[None], grads
        return jax.jit(shard_map(step, mesh, (specs, P(None, "tp")), (P("tp"), specs)))

    as_np = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float32), tree)  # noqa: E731
    want = as_np(grads(None)(state, x))
    counts = {}
    for label, policy in (("base", policies.dots_saveable),
                          ("wrapped", fo.ops_as_dots(policies.dots_saveable))):
        counts[label] = _binds(grads(policy), (state, x), "flashoverlap_gemm_all_reduce")
        jax.tree.map(np.testing.assert_array_equal, as_np(grads(policy)(state, x)), want)
    assert counts == {"base": 2, "wrapped": 1}, counts
