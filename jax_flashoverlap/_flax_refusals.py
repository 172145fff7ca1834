"""What the tensor-parallel layers refuse, and why: a flax too old for them (checked before
flax.nnx is imported), and the arguments of nnx.Linear / nn.Dense that they do not take (a user
swapping a layer in gets that said, not Python's bare "unexpected keyword argument")."""

import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping

# The oldest flax the layers run on with jax >= 0.10 (setup.py's extras and README say so too).
# Older ones break inside flax itself: flax.nnx of 0.12.0 and before does not import (it takes
# jax._src.core.mutable_array, gone in jax 0.10), and 0.12.1's nnx.jit / nn.remat pass
# jax.jit / jax.checkpoint arguments jax 0.10 removed (abstracted_axes, concrete).
MIN_FLAX = (0, 12, 2)


def flax_version(version: str) -> tuple:
  """(major, minor, patch) of a flax version string ("0.12.4", "0.13.0.dev1" -> (0, 13, 0))."""
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def check_flax_version(version: str) -> None:
  """ImportError naming the flax found and the minimum, where the layers cannot run (was
  flax's own ImportError about jax._src.core.mutable_array, or later a TypeError from nnx.jit)."""
  if flax_version(version) < MIN_FLAX:
    least = ".".join(map(str, MIN_FLAX))
    raise ImportError(f"jax_flashoverlap.flax needs flax >= {least}, found flax {version}: "
                      "older flax does not run on jax >= 0.10 (flax.nnx up to 0.12.0 does not "
                      "import, 0.12.1's nnx.jit and nn.remat fail); "
                      f"pip install 'flax>={least}'")


_DTYPE = "the layer computes in `dtype` (bfloat16 or float16) with float32 accumulation"
_KERNEL = ("the row layers' GEMM is the op's own kernel, fused with the collective, which a "
           "dot_general cannot replace")
_META = ("the layer annotates its params itself (axis_name, or kernel_axes with logical names, "
         "decides their sharding)")
LINEAR_ONLY = {
    "precision": _DTYPE,
    "preferred_element_type": _DTYPE,
    "promote_dtype": "x and the params are cast to `dtype` (bfloat16 or float16)",
    "dot_general": _KERNEL,
    "dot_general_cls": _KERNEL,
    "kernel_metadata": _META,
    "bias_metadata": _META,
}

# The ones that are nn.Dense fields: the linen layers declare them (default None) to refuse them.
LINEN_FIELDS = ("precision", "dot_general", "dot_general_cls", "promote_dtype")


@functools.lru_cache(maxsize=None)
def linear_defaults() -> dict:
  """{name: (nnx.Linear's default, nn.Dense's)} for the arguments in LINEAR_ONLY: what a
  swapped-in call that spells them out passes (lax.dot_general, flax's promote_dtype, empty
  metadata), which asks for what the layers do. Read at the first layer's construction, when
  jax_flashoverlap.flax has imported flax.nnx (after check_flax_version)."""
  from flax import linen, nnx
  params = inspect.signature(nnx.Linear.__init__).parameters
  fields = {f.name: f.default for f in dataclasses.fields(linen.Dense)}
  return {name: tuple(d for d in (getattr(params.get(name), "default", None), fields.get(name))
                      if d is not None and d is not inspect.Parameter.empty
                      and d is not dataclasses.MISSING)
          for name in LINEAR_ONLY}


def _is_default(name: str, value) -> bool:
  if value is None:  # every one's "not given" (precision, preferred_element_type: the default)
    return True
  return any(value is d or (isinstance(d, Mapping) and isinstance(value, Mapping)
                            and dict(value) == dict(d)) for d in linear_defaults()[name])


def refuse_linear_only(layer: str, given: dict) -> None:
  """TypeError for an argument of nnx.Linear / nn.Dense given a value other than its default
  there (None, or the default itself: accepted), and Python's own for any other unknown
  keyword."""
  for name, value in given.items():
    if name not in LINEAR_ONLY:
      raise TypeError(f"{layer}.__init__() got an unexpected keyword argument {name!r}")
    if not _is_default(name, value):
      raise TypeError(f"{layer}: {name}= is an argument of nnx.Linear / nn.Dense that this "
                      f"layer does not take: {LINEAR_ONLY[name]}; drop it")
