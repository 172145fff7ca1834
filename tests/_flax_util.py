"""Shared by the Flax layer tests (test_flax.py, test_flax_sequence.py)."""
import numpy as np
import jax.numpy as jnp

from _util import f32

BF16 = jnp.bfloat16


def loss(y):
  return jnp.sum(jnp.sin(y.astype(jnp.float32)))


def exact(a, b):
  np.testing.assert_array_equal(f32(a), f32(b))


def nonzero_bias(model):
  if getattr(model, "bias", None) is not None:
    model.bias[...] = jnp.linspace(-1.0, 1.0, model.bias.shape[0], dtype=model.bias.dtype)
