"""The flax versions jax_flashoverlap.flax runs on (>= 0.12.2 with jax >= 0.10; setup.py's
extras, README): older ones are refused at import, naming both versions, and on every accepted
one the NNX params carry their spec under the metadata key that flax reads (0.12.2 / 0.12.3
read `sharding_names`, 0.12.4+ `out_sharding`). Checked by hand on flax 0.12.1 .. 0.12.8
(README); CI has only the installed one."""
import os
import subprocess
import sys
import warnings

import jax
import pytest
from jax.sharding import PartitionSpec as P

from _util import REPO, make_mesh_1d

pytest.importorskip("flax")
from flax import nnx  # noqa: E402

from jax_flashoverlap._flax_refusals import MIN_FLAX, check_flax_version  # noqa: E402
from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear  # noqa: E402


def test_min_flax_is_what_setup_py_and_readme_say():
  least = ".".join(map(str, MIN_FLAX))
  for name in ("setup.py", "README.md"):
    with open(os.path.join(REPO, name)) as f:
      assert f"flax>={least}" in f.read(), name


@pytest.mark.parametrize("version,ok", [("0.12.1", False), ("0.11.2", False), ("0.10.7", False),
                                        ("0.12.2", True), ("0.12.10", True), ("0.13.0.dev1", True),
                                        ("1.0.0", True)])
def test_flax_versions_compare_as_numbers(version, ok):
  if ok:  # "0.12.10" >= "0.12.2" as numbers (not as strings)
    check_flax_version(version)
  else:
    with pytest.raises(ImportError, match=f"needs flax >= 0.12.2, found flax {version}"):
      check_flax_version(version)


def test_old_flax_is_refused_at_import_naming_both_versions(tmp_path):
  """An old flax, whose flax.nnx fails to import on jax >= 0.10 as 0.12.0's does: the error
  names the versions (before: flax's own ImportError about jax._src.core.mutable_array)."""
  for package in ("nnx", "linen"):  # flax.linen of 0.12.0 imports on jax 0.10
    (tmp_path / "flax" / package).mkdir(parents=True)
  (tmp_path / "flax" / "linen" / "__init__.py").write_text("")
  (tmp_path / "flax" / "__init__.py").write_text('__version__ = "0.12.0"\n')
  (tmp_path / "flax" / "nnx" / "__init__.py").write_text(
      "raise ImportError(\"cannot import name 'mutable_array' from 'jax._src.core'\")\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  proc = subprocess.run([sys.executable, "-c", "import jax_flashoverlap.flax"], cwd=tmp_path,
                        env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "ImportError: jax_flashoverlap.flax needs flax >= 0.12.2, found flax 0.12.0" in \
      proc.stderr, proc.stderr


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
