"""The flax versions jax_flashoverlap.flax runs on: the NNX params carry their spec under the
metadata key that the installed flax reads (0.12.2 / 0.12.3 read `sharding_names`, 0.12.4+
`out_sharding`). Checked by hand on flax 0.12.2 .. 0.12.8 (README); CI has only the installed
one."""
import warnings

import jax
import pytest
from jax.sharding import PartitionSpec as P

from _util import make_mesh_1d

pytest.importorskip("flax")
from flax import nnx  # noqa: E402

from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear  # noqa: E402


@pytest.mark.parametrize("layer,kspec,bspec", [(RowParallelLinear, P("tp", None), P(None)),
                                               (ColumnParallelLinear, P(None, "tp"), P("tp"))])
def test_nnx_params_carry_their_spec_where_this_flax_reads_it(layer, kspec, bspec):
  """nnx.get_partition_spec gives the layer's specs and the params are sharded by them under
  jax.set_mesh, with no deprecation of the key (before, on flax 0.12.2 / 0.12.3, the specs
  were P() and the params replicated: the key was `out_sharding`, which only 0.12.4+ reads)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    specs = nnx.get_partition_spec(nnx.state(layer(64, 32, rngs=nnx.Rngs(0))))
    with jax.set_mesh(make_mesh_1d(4)):
      sharded = layer(64, 32, rngs=nnx.Rngs(0))
  assert (specs["kernel"].get_value(), specs["bias"].get_value()) == (kspec, bspec)
  assert sharded.kernel[...].sharding.spec == kspec
  assert sharded.bias[...].sharding.spec == bspec
  assert not [w for w in caught if "sharding" in str(w.message)], [str(w.message) for w in caught]
