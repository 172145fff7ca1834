"""Arguments of nnx.Linear / nn.Dense that the tensor-parallel layers do not take, and why: a
user swapping a layer in gets that said, not Python's bare "unexpected keyword argument"."""

import re

def flax_version(version: str) -> tuple:
  """(major, minor, patch) of a flax version string ("0.12.4", "0.13.0.dev1" -> (0, 13, 0))."""
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


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


def refuse_linear_only(layer: str, given: dict) -> None:
  """TypeError for an argument of nnx.Linear / nn.Dense given a value (None is its default:
  accepted), and Python's own for any other unknown keyword."""
  for name, value in given.items():
    if name not in LINEAR_ONLY:
      raise TypeError(f"{layer}.__init__() got an unexpected keyword argument {name!r}")
    if value is not None:
      raise TypeError(f"{layer}: {name}= is an argument of nnx.Linear / nn.Dense that this "
                      f"layer does not take: {LINEAR_ONLY[name]}; drop it")
