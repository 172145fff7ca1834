"""Forward-mode differentiation (jax.jvp, jax.linearize, Hessian-vector products) through every
op equals that of XLA's own composition. The ops were custom_vjp functions, and JAX refuses
forward mode on those ("can't apply forward-mode autodiff (jvp) to a custom_vjp function");
psum(x @ w) supports it, so the ops must too. Reverse mode is tests/test_grads.py."""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import assert_close, make_mesh_1d, make_mesh_2d, rand, shard_map

N = 4


def _ops():
  import jax_flashoverlap as fo
  return {  # name -> (ours, XLA's, x shape, w shape, in specs, out spec)
      "all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                     lambda x, w: lax.psum(x @ w, "tp"),
                     (6, 16 * N), (16 * N, 24), (P(None, "tp"), P("tp", None)), P()),
      "reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
                         lambda x, w: lax.psum_scatter(x @ w, "tp", tiled=True),
                         (2 * N, 16 * N), (16 * N, 32), (P(None, "tp"), P("tp", None)),
                         P("tp", None)),
      "matmul": (lambda x, w: fo.matmul(x, w), lambda x, w: x @ w,
                 (5 * N, 24), (24, 16), (P("tp", None), P()), P("tp", None)),
      "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
                     lambda x, w: lax.all_to_all(x @ w, "tp", 0, 0, tiled=True),
                     (4 * N, 16), (16, 24), (P("tp", None), P()), P("tp", None)),
      "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                     lambda x, w: lax.all_gather(x, "tp", axis=0, tiled=True) @ w,
                     (3 * N, 16), (16, 8 * N), (P("tp", None), P(None, "tp")), P(None, "tp")),
  }


def _inputs(seed, x_shape, w_shape, dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  return (rand(rng, x_shape, dtype), rand(rng, w_shape, dtype), rand(rng, x_shape, dtype),
          rand(rng, w_shape, dtype))


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul", "all_to_all",
                                  "all_gather"])
def test_jvp_and_linearize_equal_xla(name):
  ours, xla, x_shape, w_shape, ins, out = _ops()[name]
  mesh = make_mesh_1d(N)
  f, g = (shard_map(body, mesh, ins, out) for body in (ours, xla))
  x, w, dx, dw = _inputs(1, x_shape, w_shape)
  y, t = jax.jit(lambda *a: jax.jvp(f, a[:2], a[2:]))(x, w, dx, dw)
  y_ref, t_ref = jax.jit(lambda *a: jax.jvp(g, a[:2], a[2:]))(x, w, dx, dw)
  assert_close(y, y_ref)
  assert_close(t, t_ref)
  y_lin, f_lin = jax.linearize(f, x, w)
  assert_close(y_lin, y_ref)
  assert_close(f_lin(dx, dw), t_ref)


def _dots(compiled_text: str) -> int:
  return len(re.findall(r"= \S+ dot\(", compiled_text))


@pytest.mark.parametrize("arg", [0, 1], ids=["in-x", "in-w"])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul", "all_to_all",
                                  "all_gather"])
def test_jvp_in_one_argument_is_xlas_tangent_with_one_gemm(name, arg):
  """jvp / linearize in x alone (w fixed, as in a layer's forward-mode derivative in its
  input) or in w alone: the tangent is XLA's own, bit for bit, from one GEMM. The rule had
  filled the other argument's zero tangent in: a GEMM against zeros, whose sum with the other
  term before the collective rounded each rank's bfloat16 product, one bfloat16 step off
  XLA's tangent and off the op's own value at the tangent (all-reduce, reduce-scatter)."""
  ours, xla, x_shape, w_shape, ins, out = _ops()[name]
  mesh = make_mesh_1d(N)
  x, w, dx, dw = _inputs(5, x_shape, w_shape)
  primal, tangent = (x, w)[arg], (dx, dw)[arg]

  def tangent_only(body):
    f = shard_map(body, mesh, ins, out)
    g = (lambda a: f(a, w)) if arg == 0 else (lambda b: f(x, b))  # noqa: E731
    return jax.jit(lambda p, t: jax.jvp(g, (p,), (t,))[1])

  got, want = (tangent_only(body) for body in (ours, xla))
  np.testing.assert_array_equal(np.asarray(got(primal, tangent), np.float32),
                                np.asarray(want(primal, tangent), np.float32))
  # the op itself at the tangent (it is linear in each argument): the same bits again
  at_tangent = shard_map(ours, mesh, ins, out)(*((dx, w) if arg == 0 else (x, dw)))
  np.testing.assert_array_equal(np.asarray(got(primal, tangent), np.float32),
                                np.asarray(at_tangent, np.float32))
  dots = [_dots(f.lower(primal, tangent).compile().as_text()) for f in (got, want)]
  assert dots[0] == dots[1] == 1, dots


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_gather"])
def test_hessian_vector_product_equals_xla(name):
  """jvp of grad (forward over reverse) of a loss that is not linear in the op's output."""
  ours, xla, x_shape, w_shape, ins, out = _ops()[name]
  mesh = make_mesh_1d(N)
  x, w, dx, dw = _inputs(2, x_shape, w_shape, jnp.float16)

  def hvp(body):
    f = shard_map(body, mesh, ins, out)
    loss = lambda x, w: jnp.sum(jnp.tanh(f(x, w).astype(jnp.float32)))  # noqa: E731
    return jax.jit(lambda *a: jax.jvp(jax.grad(loss, argnums=(0, 1)), a[:2], a[2:])[1])(
        x, w, dx, dw)

  for got, want in zip(hvp(ours), hvp(xla)):
    assert_close(got, want)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_jvp_of_the_global_views(reduce):
  import jax_flashoverlap as fo
  mesh = make_mesh_2d(2, 4)
  x, w, dx, dw = _inputs(3, (16, 64), (64, 32))
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
  x, dx = put(x, P("dp", "tp")), put(dx, P("dp", "tp"))
  w, dw = put(w, P("tp", None)), put(dw, P("tp", None))
  row = lambda x, w: fo.row_parallel_matmul(x, w, reduce)  # noqa: E731
  y, t = jax.jit(lambda *a: jax.jvp(row, a[:2], a[2:]))(x, w, dx, dw)
  y_ref, t_ref = jax.jit(lambda *a: jax.jvp(jnp.matmul, a[:2], a[2:]))(x, w, dx, dw)
  assert_close(y, y_ref)
  assert_close(t, t_ref)
  xs = put(np.asarray(x), P(("dp", "tp"), None))
  dxs = put(np.asarray(dx), P(("dp", "tp"), None))
  wc, dwc = put(np.asarray(w), P(None, "tp")), put(np.asarray(dw), P(None, "tp"))
  col = lambda x, w: fo.column_parallel_matmul(x, w)  # noqa: E731
  y, t = jax.jit(lambda *a: jax.jvp(col, a[:2], a[2:]))(xs, wc, dxs, dwc)
  y_ref, t_ref = jax.jit(lambda *a: jax.jvp(jnp.matmul, a[:2], a[2:]))(xs, wc, dxs, dwc)
  assert_close(y, y_ref)
  assert_close(t, t_ref)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_jvp_of_the_global_view_in_x_alone_is_one_gemm(reduce):
  """The global view's tangent in x alone (w fixed) is XLA's, from one GEMM, not two (one of
  them against w's zero tangent, filled in)."""
  import jax_flashoverlap as fo
  mesh = make_mesh_2d(2, 4)
  x, w, dx, _ = _inputs(6, (16, 64), (64, 32))
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
  x, dx, w = put(x, P("dp", "tp")), put(dx, P("dp", "tp")), put(w, P("tp", None))
  ours = jax.jit(lambda a, t: jax.jvp(lambda b: fo.row_parallel_matmul(b, w, reduce), (a,),
                                      (t,))[1])
  xla = jax.jit(lambda a, t: jax.jvp(lambda b: b @ w, (a,), (t,))[1])
  assert_close(ours(x, dx), xla(x, dx))
  dots = [_dots(f.lower(x, dx).compile().as_text()) for f in (ours, xla)]
  assert dots[0] == dots[1] == 1, dots


_PRIMITIVES = {"all_reduce": "flashoverlap_gemm_all_reduce",
               "reduce_scatter": "flashoverlap_gemm_reduce_scatter",
               "matmul": "flashoverlap_gemm", "all_to_all": "flashoverlap_gemm_all_to_all",
               "all_gather": "flashoverlap_all_gather_gemm"}


@pytest.mark.parametrize("name", sorted(_PRIMITIVES))
def test_the_primal_under_jvp_and_grad_is_our_op(name):
  """Only the tangent is the reference composition's: jvp and grad compute the
  primal output with the op's own primitive (on GPUs the overlapped kernel). The reference's
  primal has the same values, so computing it instead would silently drop the overlap from
  every training step."""
  ours, _, x_shape, w_shape, ins, out = _ops()[name]
  f = shard_map(ours, make_mesh_1d(N), ins, out)
  x, w, dx, dw = _inputs(4, x_shape, w_shape)
  prim = re.compile(rf"(?<![A-Za-z0-9_]){_PRIMITIVES[name]}\[")
  jvp = jax.make_jaxpr(lambda *a: jax.jvp(f, a[:2], a[2:]))(x, w, dx, dw)
  loss = lambda x, w: jnp.sum(jnp.sin(f(x, w).astype(jnp.float32)))  # noqa: E731
  grad = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w)
  for text in (str(jvp), str(grad)):
    assert len(prim.findall(text)) == 1, text
