"""Arguments of nnx.Linear / nn.Dense that the tensor-parallel layers do not take (a user
swapping a layer in passes them): each is a TypeError saying why and to drop it, where it
was Python's bare "unexpected keyword argument" (NNX) or a dataclass error (linen). Their
default is accepted (None, or nnx.Linear's / nn.Dense's own spelt out); any other unknown
keyword keeps Python's message."""
import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest

nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")
from jax_flashoverlap import flax as fl  # noqa: E402
from jax_flashoverlap._flax_refusals import LINEAR_ONLY, LINEN_FIELDS  # noqa: E402


@pytest.mark.parametrize("layer", ["RowParallelLinear", "ColumnParallelLinear"])
@pytest.mark.parametrize("name", sorted(LINEAR_ONLY))
def test_nnx_layers_refuse_nnx_linear_arguments_saying_why(layer, name):
  value = jax.lax.Precision.HIGHEST if name == "precision" else object()
  with pytest.raises(TypeError, match=rf"^{layer}: {name}= is an argument of nnx.Linear / "
                                      rf"nn.Dense that this layer does not take: .+; drop it$"):
    getattr(fl, layer)(64, 64, rngs=nnx.Rngs(0), **{name: value})
  getattr(fl, layer)(64, 64, rngs=nnx.Rngs(0), **{name: None})  # the default: accepted


def test_nnx_unknown_keyword_keeps_pythons_message():
  with pytest.raises(TypeError, match=r"^RowParallelLinear.__init__\(\) got an unexpected "
                                      r"keyword argument 'out_feature'$"):
    fl.RowParallelLinear(64, 64, rngs=nnx.Rngs(0), out_feature=64)


@pytest.mark.parametrize("layer", ["RowParallelDense", "ColumnParallelDense"])
@pytest.mark.parametrize("name", ["precision", "dot_general", "dot_general_cls",
                                  "promote_dtype"])
def test_linen_layers_refuse_nn_dense_arguments_saying_why(layer, name):
  x = jnp.ones((8, 64), jnp.bfloat16)
  with pytest.raises(TypeError, match=rf"^{layer}: {name}= is an argument of nnx.Linear / "
                                      r"nn.Dense that this layer does not take"):
    getattr(fl, layer)(64, **{name: "highest"}).init(jax.random.key(0), x)
  variables = getattr(fl, layer)(64, **{name: None}).init(jax.random.key(0), x)
  assert nn.unbox(variables)["params"]["kernel"].shape == (64, 64)


def test_nnx_layers_take_nnx_linears_own_defaults_spelt_out():
  # A swapped-in call that spells out nnx.Linear's defaults (lax.dot_general, flax's
  # promote_dtype, empty metadata) asks for what the layers do: accepted as None is. They were
  # refused ("drop it"), though the docs say the default is accepted.
  params = inspect.signature(nnx.Linear.__init__).parameters
  defaults = {n: params[n].default for n in LINEAR_ONLY if n in params}
  assert {"dot_general", "promote_dtype", "kernel_metadata", "bias_metadata"} <= set(defaults)
  defaults["kernel_metadata"] = {}  # an empty dict, as a caller writes it, is the same
  for layer in ("RowParallelLinear", "ColumnParallelLinear"):
    spelt = getattr(fl, layer)(64, 64, rngs=nnx.Rngs(0), **defaults)
    plain = getattr(fl, layer)(64, 64, rngs=nnx.Rngs(0))
    assert (spelt.kernel[...] == plain.kernel[...]).all()
  with pytest.raises(TypeError, match=r"^RowParallelLinear: kernel_metadata= is an argument"):
    fl.RowParallelLinear(64, 64, rngs=nnx.Rngs(0), kernel_metadata={"out_sharding": ("tp",)})


@pytest.mark.parametrize("layer", ["RowParallelDense", "ColumnParallelDense"])
def test_linen_layers_take_nn_denses_own_defaults_spelt_out(layer):
  # nn.Dense's promote_dtype default is flax's promote_dtype, not None: spelt out, accepted.
  defaults = {f.name: f.default for f in dataclasses.fields(nn.Dense) if f.name in LINEN_FIELDS}
  assert defaults["promote_dtype"] is not None
  x = jnp.ones((8, 64), jnp.bfloat16)
  variables = getattr(fl, layer)(64, **defaults).init(jax.random.key(0), x)
  assert nn.unbox(variables)["params"]["kernel"].shape == (64, 64)
