"""Plan overrides as a user tuning by hand meets them (session 44's audit): a forced plan
around a function JAX had already lowered, the priority of a forced comm_sms, bands that are
not a plan, and a tuned-config folder that cannot be read. The lowerings are cross-lowered for
CUDA on CPU devices, where the plans are made."""
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jax_flashoverlap import distributed, plan, plan_a2a, tuning

ARGS = (jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16),
        jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16))


def _all_reduce(fo, **kw):
  mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
  return jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", **kw), mesh=mesh,
                       in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())


def _plan_of(f):
  """(band_rows, comm_sms) of the custom call in f's CUDA lowering, or "XLA"."""
  text = jax.jit(f).trace(*ARGS).lower(lowering_platforms=("cuda",)).as_text()
  if "flashoverlap_gemm_all_reduce" not in text:
    return "XLA"
  bands = re.search(r"band_rows = dense<\[([0-9, ]+)\]>", text).group(1)
  return bands, int(re.search(r"comm_sms = ([0-9]+)", text).group(1))


def test_a_forced_plan_reaches_a_function_lowered_before(fo, monkeypatch):
  """JAX gave back a function's earlier lowering under forced(...), whose plan it never
  asked for: a loop `with forced(num_groups=g): jit(step)(...)` measured the first plan every
  time, and forced(overlap=False) still ran our kernels. The overrides in force are part of
  jit's cache key now; outside them the function's first lowering comes back."""
  monkeypatch.setenv("JAX_FLASHOVERLAP_TUNED", "0")
  f = _all_reduce(fo)
  default = _plan_of(f)
  with plan.forced(num_groups=3, comm_sms=24):
    three = _plan_of(f)
  assert three[1] == 24 and len(three[0].split(",")) == 4 and three != default
  with plan.forced(num_groups=2):
    assert len(_plan_of(f)[0].split(",")) == 3
  with plan.forced(overlap=False):
    assert _plan_of(f) == "XLA"
  assert _plan_of(f) == default
  with plan_a2a.forced(num_groups=2):  # the all-to-all's override: this op's plan unchanged
    assert _plan_of(f) == default
  seen = []  # another thread does not see this thread's override
  with plan.forced(num_groups=3, comm_sms=24):
    worker = threading.Thread(target=lambda: seen.append(_plan_of(f)))
    worker.start()
    worker.join()
  assert seen == [default]


def test_a_forced_comm_sms_wins_over_the_ops_own(fo, monkeypatch):
  """The documented priority puts forced(...) first; an explicit comm_sms= beat its comm_sms
  (with its bands: a plan of one and the other), as it did not beat its overlap=False."""
  monkeypatch.setenv("JAX_FLASHOVERLAP_TUNED", "0")
  with plan.forced(num_groups=2, comm_sms=20):
    assert _plan_of(_all_reduce(fo, comm_sms=8))[1] == 20
  assert _plan_of(_all_reduce(fo, comm_sms=8))[1] == 8
  with plan_a2a.forced(comm_sms=20):
    assert plan_a2a._profile_for(8).comm_sms == 20
  assert plan_a2a._profile_for(8).comm_sms == 8


@pytest.mark.parametrize("bands", [[], [0], [4096]])
def test_forced_band_rows_that_are_no_plan(bands):
  """Fewer than two boundaries: a TypeError from deep in the all-reduce's cost model
  ('<lambda>() missing 2 required positional arguments') at the first lowering."""
  with pytest.raises(ValueError, match=r"forced\(\): band_rows needs at least 2 boundaries"):
    plan.forced(band_rows=bands)


def test_a_config_folder_that_cannot_be_read_is_a_config_error(monkeypatch, tmp_path):
  """Path.is_dir raises for a name too long (or a folder without access) instead of returning
  False: an OSError escaped every plan lookup and `info` died with a traceback."""
  monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path / ("x" * 300)))
  with pytest.raises(tuning.ConfigError, match=r"cannot read the tuned-config folder .*File "
                     r"name too long"):
    tuning.config_files()
  from jax_flashoverlap import _info
  problems = []
  _info._tuned_configs(problems)
  assert any("cannot read the tuned-config folder" in p for p in problems), problems


@pytest.mark.parametrize("args, said", [
    (("h:1", "2", 0), "num_processes must be an int, got '2' (str)"),
    (("h:1", 2.5, 0), "num_processes must be an int, got 2.5 (float)"),
    (("h:1", True, 0), "num_processes must be an int, got True (bool)"),  # was: 1, a no-op
    (("h:1", 2, False), "process_id must be an int, got False (bool)"),
    (("h:1", 2, 1.5), "process_id must be an int, got 1.5 (float)"),
    ((1234, 2, 0), "coordinator_address must be a 'HOST:PORT' string, got 1234"),
])
def test_initialize_arguments_of_the_wrong_type(monkeypatch, args, said):
  """Only the launcher's variables were checked: a string from argparse was a bare
  `'<' not supported` TypeError, a float or bool passed on to jax.distributed."""
  for name in (distributed.COORDINATOR_ENV, distributed.NUM_PROCESSES_ENV,
               distributed.PROCESS_ID_ENV):
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(TypeError, match=re.escape(said)):
    distributed.launch_settings(*args)
  assert distributed.launch_settings("h:1", np.int64(2), np.int32(1)) == {
      "coordinator_address": "h:1", "num_processes": 2, "process_id": 1}
