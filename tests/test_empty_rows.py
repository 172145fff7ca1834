"""x with no rows (a leading dim of 0: an empty batch) is a legal input. There is nothing to
compute or overlap, so every op returns what XLA's own composition types (shape, dtype,
varying axes) and JAX's gradients (zeros for w, an empty dx); where XLA's own collective
fails to lower an empty operand (psum_scatter of no rows, all_gather: "... cannot be zero"),
the same empty result without the collective. The ops refused
such x ("x must not be empty"), so a row layer failed where nnx.Linear / nn.Dense returned an
empty result."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import make_mesh_1d, make_mesh_2d, rand, shard_map

N = 4


def _cases():
  import jax_flashoverlap as fo
  # name -> (ours, XLA's composition, x shape (global), w shape, in specs, out spec, the
  # shape XLA's result has per device)
  return {
      "all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                     lambda x, w: lax.psum(x @ w, "tp"),
                     (0, 16 * N), (16 * N, 24), (P(None, "tp"), P("tp", None)), P()),
      "all_reduce_3d": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                        lambda x, w: lax.psum(x @ w, "tp"),
                        (2, 0, 16 * N), (16 * N, 24), (P(None, None, "tp"), P("tp", None)), P()),
      "reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
                         lambda x, w: lax.psum_scatter(x @ w, "tp", tiled=True),
                         (0, 16 * N), (16 * N, 32), (P(None, "tp"), P("tp", None)), P("tp")),
      "reduce_scatter_seq1": (
          lambda x, w: fo.matmul_reduce_scatter(x, w, "tp", sequence_dim=1),
          lambda x, w: lax.psum_scatter(x @ w, "tp", scatter_dimension=1, tiled=True),
          (0, 2 * N, 16 * N), (16 * N, 32), (P(None, None, "tp"), P("tp", None)),
          P(None, "tp")),
      "matmul": (lambda x, w: fo.matmul(x, w), lambda x, w: x @ w,
                 (0, 24), (24, 16), (P("tp", None), P()), P("tp", None)),
      "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
                     lambda x, w: lax.all_to_all(x @ w, "tp", 0, 0, tiled=True),
                     (0, 16), (16, 24), (P("tp", None), P()), P("tp", None)),
      "all_to_all_ulysses": (
          lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=1, concat_axis=0),
          lambda x, w: lax.all_to_all(x @ w, "tp", 1, 0, tiled=True),
          (0, 16), (16, 8 * N), (P("tp", None), P()), P("tp", None)),
      "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                     lambda x, w: lax.all_gather(x, "tp", axis=0, tiled=True) @ w,
                     (0, 16), (16, 8 * N), (P("tp", None), P(None, "tp")), P(None, "tp")),
      "all_gather_seq1": (
          lambda x, w: fo.all_gather_matmul(x, w, "tp", sequence_dim=1),
          lambda x, w: lax.all_gather(x, "tp", axis=1, tiled=True) @ w,
          (0, 2 * N, 16), (16, 8 * N), (P(None, "tp", None), P(None, "tp")),
          P(None, None, "tp")),
      "all_gather_returned": (
          lambda x, w: fo.all_gather_matmul(x, w, "tp", return_gathered=True),
          lambda x, w: (lax.all_gather(x, "tp", axis=0, tiled=True) @ w,
                        lax.all_gather(x, "tp", axis=0, tiled=True)),
          (0, 16), (16, 8 * N), (P("tp", None), P(None, "tp")), (P(None, "tp"), P("tp"))),
  }


def _sm(body, mesh, in_specs, out_specs, check_vma):
  return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=check_vma)


def _shapes(tree):
  return [(a.shape, a.dtype) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_no_rows_give_xlas_empty_result_and_gradients(name, check_vma):
  ours, xla, x_shape, w_shape, ins, out = _cases()[name]
  mesh = make_mesh_1d(N)
  rng = np.random.default_rng(0)
  x, w = rand(rng, x_shape, jnp.bfloat16), rand(rng, w_shape, jnp.bfloat16)
  f = jax.jit(_sm(ours, mesh, ins, out, check_vma))
  got = f(x, w)

  def loss(body):
    g = _sm(body, mesh, ins, out, check_vma)
    return lambda x, w: sum(jnp.sum(a.astype(jnp.float32)) for a in jax.tree.leaves(g(x, w)))

  dx, dw = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(x, w)
  assert dx.shape == x.shape and dx.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(dw, np.float32), np.zeros(w.shape, np.float32))
  # XLA's composition, where it lowers: the same types (and trivially the same values)
  want = jax.eval_shape(_sm(xla, mesh, ins, out, check_vma), x, w)
  assert _shapes(got) == _shapes(want)
  assert all(a.size == 0 for a in jax.tree.leaves(got))


def test_xlas_own_collectives_fail_on_no_rows_where_ours_do_not():
  """The premise of the collective-free results: XLA's psum_scatter of no rows and all_gather
  of an empty operand do not lower (if these start to pass, the ops could return XLA's
  composition there too)."""
  mesh = make_mesh_1d(N)
  w = jnp.ones((16 * N, 32), jnp.bfloat16)
  scatter = shard_map(lambda x, w: lax.psum_scatter(x @ w, "tp", tiled=True), mesh,
                      (P(None, "tp"), P("tp", None)), P("tp"))
  with pytest.raises(Exception, match="cannot be zero"):
    jax.jit(scatter)(jnp.zeros((0, 16 * N), jnp.bfloat16), w)
  gather = shard_map(lambda x: lax.all_gather(x, "tp", axis=0, tiled=True), mesh, P("tp"),
                     P("tp"))
  with pytest.raises(Exception, match="cannot be zero"):
    jax.jit(gather)(jnp.zeros((0, 16), jnp.bfloat16))


def test_vmap_and_jvp_of_no_rows():
  import jax_flashoverlap as fo
  mesh = make_mesh_1d(N)
  x = jnp.zeros((3, 0, 16 * N), jnp.bfloat16)
  w = jnp.ones((16 * N, 24), jnp.bfloat16)
  body = jax.vmap(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), in_axes=(0, None))
  y = jax.jit(shard_map(body, mesh, (P(None, None, "tp"), P("tp", None)), P()))(x, w)
  assert y.shape == (3, 0, 24)
  f = shard_map(lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"), mesh,
                (P(None, "tp"), P("tp", None)), P("tp"))
  x2 = jnp.zeros((0, 16 * N), jnp.bfloat16)
  _, t = jax.jit(lambda x, w: jax.jvp(f, (x, w), (x, w)))(x2, w)
  assert t.shape == (0, 24)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_global_views_of_no_rows(reduce):
  import jax_flashoverlap as fo
  mesh = make_mesh_2d(2, 4)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
  x = put(jnp.zeros((0, 64), jnp.bfloat16), P("dp", "tp"))
  w = put(jnp.ones((64, 32), jnp.bfloat16), P("tp", None))
  y = jax.jit(lambda x, w: fo.row_parallel_matmul(x, w, reduce))(x, w)
  assert (y.shape, y.dtype) == ((0, 32), jnp.bfloat16)
  dw = jax.jit(jax.grad(lambda w: jnp.sum(fo.row_parallel_matmul(x, w, reduce)
                                          .astype(jnp.float32))))(w)
  np.testing.assert_array_equal(np.asarray(dw, np.float32), np.zeros((64, 32), np.float32))
  xc = put(jnp.zeros((0, 64), jnp.bfloat16), P(("dp", "tp"), None))
  wc = put(jnp.ones((64, 32), jnp.bfloat16), P(None, "tp"))
  yc = jax.jit(lambda x, w: fo.column_parallel_matmul(x, w))(xc, wc)
  assert (yc.shape, yc.dtype) == ((0, 32), jnp.bfloat16)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_flax_layers_take_an_empty_batch_as_nnx_linear_does(reduce):
  """An MLP of our layers on an empty batch, under jax.set_mesh and nnx.jit (the global
  view) and inside shard_map: the empty output nnx.Linear gives, and zero kernel gradients."""
  nnx = pytest.importorskip("flax.nnx")
  from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear
  mesh = make_mesh_1d(N)
  with jax.sharding.set_mesh(mesh):
    up = ColumnParallelLinear(32, 64, rngs=nnx.Rngs(0))
    down = RowParallelLinear(64, 32, reduce=reduce, rngs=nnx.Rngs(1))
    ref = nnx.Linear(32, 32, rngs=nnx.Rngs(2), dtype=jnp.bfloat16)
    x = jax.device_put(jnp.zeros((0, 32), jnp.bfloat16), NamedSharding(mesh, P()))
    y = nnx.jit(lambda up, down, x: down(jax.nn.gelu(up(x))))(up, down, x)
    assert (y.shape, y.dtype) == (ref(x).shape, ref(x).dtype) == ((0, 32), jnp.bfloat16)
    grads = nnx.grad(lambda down, x: jnp.sum(down(x).astype(jnp.float32)))(
        down, jnp.zeros((0, 64), jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(grads["kernel"][...], np.float32),
                                np.zeros((64, 32), np.float32))
