"""jax_flashoverlap.distributed against a fake of JAX's distributed client (a key-value store
that refuses to overwrite a key, as JAX's does, and barriers that record who waits): the keys
each step writes and reads, which processes take part, what is compared, and the launcher's
settings as initialize() takes them. Real processes: tests/test_multiprocess.py; the errors
of a peer that never comes: tests/test_bad_inputs.py ("dist-" rows)."""
import hashlib
import json

import jax
import pytest

from _util import set_env

from jax_flashoverlap import _compat, distributed


class _KV:
  """A key-value store (keys written once) preloaded with the other processes' values."""

  def __init__(self, others=None):
    self.store, self.sets, self.gets, self.barriers = dict(others or {}), [], [], []

  def key_value_set(self, key, value):
    if key in self.store:
      raise RuntimeError(f"ALREADY_EXISTS: {key}")
    self.store[key] = value
    self.sets.append(key)

  def blocking_key_value_get(self, key, timeout_ms):
    self.gets.append(key)
    if key not in self.store:
      raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
    return self.store[key]

  def wait_at_barrier(self, key, timeout_ms, **kwargs):
    self.barriers.append((key, timeout_ms, kwargs))


@pytest.fixture
def kv(monkeypatch):
  """Process 0 of 3, with a fresh store and fresh per-scope check counts."""
  store = _KV()
  monkeypatch.setattr(_compat, "distributed_client", lambda: store)
  monkeypatch.setattr(jax, "process_count", lambda *a, **k: 3)
  monkeypatch.setattr(jax, "process_index", lambda *a, **k: 0)
  monkeypatch.setattr(distributed, "_check_counters", {})
  monkeypatch.setattr(distributed, "_hosts", {})
  monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
  return store


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("raw, ms", [(None, 300_000), ("", 300_000), (" 2.5 ", 2500),
                                     ("0.0001", 1), ("2147483.647", 2**31 - 1)])
def test_timeout_ms(monkeypatch, raw, ms):
  """Unset: 300 s; a fraction of a millisecond is 1 ms (0 would not wait at all); the largest
  the store's int takes is allowed."""
  set_env(monkeypatch, distributed.TIMEOUT_ENV, raw)
  assert distributed.timeout_ms() == ms


@pytest.mark.parametrize("raw", ["0", "-1", "2147483.648", "nan", "inf"])
def test_timeout_ms_refuses_what_the_store_cannot_wait(monkeypatch, raw):
  monkeypatch.setenv(distributed.TIMEOUT_ENV, raw)
  with pytest.raises(ValueError, match=f"{distributed.TIMEOUT_ENV}='{raw}' must be a positive "
                                       "number of seconds"):
    distributed.timeout_ms()


@pytest.mark.parametrize("raw, n", [(None, 1), (" ", 1), ("3", 3)])
def test_launched_processes(monkeypatch, raw, n):
  set_env(monkeypatch, distributed.NUM_PROCESSES_ENV, raw)
  assert distributed.launched_processes() == n


@pytest.fixture
def no_launcher(monkeypatch):
  for name in (distributed.COORDINATOR_ENV, distributed.NUM_PROCESSES_ENV,
               distributed.PROCESS_ID_ENV):
    monkeypatch.delenv(name, raising=False)


def test_launch_settings_from_arguments_before_variables(monkeypatch, no_launcher):
  """Arguments win over the launcher's variables, 0 included (a given 0 is not 'unset')."""
  assert distributed.launch_settings() is None
  assert distributed.launch_settings("host:1", 2, 0) == {
      "coordinator_address": "host:1", "num_processes": 2, "process_id": 0}
  monkeypatch.setenv(distributed.COORDINATOR_ENV, "env:2")
  monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "4")
  monkeypatch.setenv(distributed.PROCESS_ID_ENV, "3")
  assert distributed.launch_settings("host:1", 2, 0) == {
      "coordinator_address": "host:1", "num_processes": 2, "process_id": 0}
  assert distributed.launch_settings() == {
      "coordinator_address": "env:2", "num_processes": 4, "process_id": 3}


@pytest.mark.parametrize("num, pid, words", [
    (0, 0, ["num_processes", distributed.NUM_PROCESSES_ENV, "must be >= 1, got 0"]),
    (2, -1, ["process_id", distributed.PROCESS_ID_ENV, "must be in [0, 2)", "got -1"]),
])
def test_launch_settings_refuse_out_of_range(no_launcher, num, pid, words):
  with pytest.raises(ValueError) as err:
    distributed.launch_settings("host:1", num, pid)
  assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:99999", "127.0.0.1:notaport",
                                     ":1234", "host:0", "host:"])
def test_launch_settings_refuse_a_coordinator_that_is_not_host_port(no_launcher, address):
  """JAX's own handling: an IndexError from inside it (no port), a failed RPC server (a port
  that is no number), a wait with no end (a port past 65535); `info` reported nothing."""
  with pytest.raises(ValueError, match=r"coordinator_address \(JAX_FLASHOVERLAP_COORDINATOR\) "
                     r"must be HOST:PORT with a port in \[1, 65535\], got " + repr(address)):
    distributed.launch_settings(address, 2, 0)
  assert distributed.launch_settings("[::1]:65535", 2, 1)["coordinator_address"] == "[::1]:65535"


def test_initialize_leaves_a_running_runtime_alone(monkeypatch):
  """Already initialized (here: a client exists): jax.distributed.initialize is not called
  again (it raises when called twice), whatever the launcher's variables say."""
  called = []
  monkeypatch.setattr(_compat, "distributed_client", lambda: _KV())
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: called.append(kw))
  monkeypatch.setenv(distributed.COORDINATOR_ENV, "127.0.0.1:1")
  monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "2")
  monkeypatch.setenv(distributed.PROCESS_ID_ENV, "1")
  distributed.initialize()
  assert called == []
  monkeypatch.setattr(_compat, "distributed_client", lambda: None)
  distributed.initialize(timeout=5)
  assert called == [{"coordinator_address": "127.0.0.1:1", "num_processes": 2,
                     "process_id": 1, "timeout": 5}]


# ----------------------------------------------------------------------------- key-value steps

def test_publish_fetch_and_share_use_the_prefixed_key(kv):
  distributed.publish("x/1", "v")
  assert kv.store == {"jax_flashoverlap/x/1": "v"}
  kv.store["jax_flashoverlap/uid/9"] = "theirs"
  assert distributed.fetch("uid/9", 2) == "theirs" and kv.gets == ["jax_flashoverlap/uid/9"]
  made = []
  assert distributed.share("mine", 0, lambda: made.append(1) or "made here") == "made here"
  assert kv.store["jax_flashoverlap/mine"] == "made here" and made == [1]
  kv.store["jax_flashoverlap/theirs"] = "from 1"
  assert distributed.share("theirs", 1, lambda: pytest.fail("made by a non-owner")) == "from 1"


def test_all_succeed_reports_each_failed_process_on_every_one(kv):
  kv.store.update({"jax_flashoverlap/s1/1": "ok", "jax_flashoverlap/s1/2": "ok"})
  assert distributed.all_succeed("s1", lambda: 42, what="the step") == 42
  assert kv.store["jax_flashoverlap/s1/0"] == "ok"
  # another process failed, this one did not: raised here too, naming that process only
  kv.store.update({"jax_flashoverlap/s2/1": "ok", "jax_flashoverlap/s2/2": "OSError: gone"})
  with pytest.raises(distributed.CollectiveStepError) as err:
    distributed.all_succeed("s2", lambda: 1, what="the step")
  assert str(err.value) == "jax_flashoverlap: the step failed on process 2: OSError: gone"
  # this one failed (published for the others, chained here) and so did process 1
  kv.store.update({"jax_flashoverlap/s3/1": "KeyError: 'x'"})

  def fails():
    raise ValueError("no GPU")
  with pytest.raises(distributed.CollectiveStepError) as err:
    distributed.all_succeed("s3", fails, processes=[1, 0], what="the step")
  assert kv.store["jax_flashoverlap/s3/0"] == "ValueError: no GPU"
  assert str(err.value) == ("jax_flashoverlap: the step failed on process 0: ValueError: no "
                            "GPU; process 1: KeyError: 'x'")
  assert isinstance(err.value.__cause__, ValueError)


def test_process_hosts_publishes_once(kv):
  kv.store.update({"jax_flashoverlap/host/1": "boot:b", "jax_flashoverlap/host/2": "boot:c"})
  mine = distributed._this_host()
  assert distributed.process_hosts([2, 1]) == {1: "boot:b", 2: "boot:c"}
  assert distributed.process_hosts(None) == {0: mine, 1: "boot:b", 2: "boot:c"}
  assert kv.sets == ["jax_flashoverlap/host/0"]  # a second publish would be refused


def test_this_host_is_the_boot_id():
  """Containers of one machine share the kernel's boot id, not their host names."""
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
  except OSError:
    pytest.skip("no boot id on this system (the host name stands in)")
  assert distributed._this_host() == f"boot:{boot}"


def test_barrier_waits_for_the_processes_named(kv, monkeypatch):
  monkeypatch.setenv(distributed.TIMEOUT_ENV, "7")
  distributed.barrier("b1")
  distributed.barrier("b2", processes=[2, 0, 2])
  assert kv.barriers == [("jax_flashoverlap/barrier/b1", 7000, {}),
                         ("jax_flashoverlap/barrier/b2", 7000, {"process_ids": [0, 2]})]


def test_a_store_refusing_its_arguments_is_no_timeout(kv, monkeypatch):
  def refuse(*args, **kwargs):
    raise TypeError("incompatible function arguments")
  monkeypatch.setattr(kv, "wait_at_barrier", refuse)
  monkeypatch.setattr(kv, "blocking_key_value_get", refuse)
  with pytest.raises(TypeError, match="incompatible"):
    distributed.barrier("b")
  with pytest.raises(TypeError, match="incompatible"):
    distributed.check_identical("the plan", 1)


# ----------------------------------------------------------------------------- check_identical

def test_check_identical_outside_or_alone_touches_nothing(kv):
  distributed.check_identical("the plan", 1, processes=[1, 2])  # process 0 is not one of them
  distributed.check_identical("the plan", 1, processes=[0])
  assert kv.sets == [] and kv.gets == []


def _theirs(scope, seq, values):
  return {f"jax_flashoverlap/check/{scope}/{seq}/{p}": json.dumps(v, sort_keys=True)
          for p, v in values.items()}


def test_check_identical_counts_each_set_of_processes_apart(kv):
  """The n-th check among processes {0, 1} meets the n-th of those two, whatever checks
  among all three came between; dicts compare by content, not key order."""
  pair = hashlib.blake2b(repr([0, 1]).encode(), digest_size=8).hexdigest()
  plan = {"b": 2, "a": 1}
  kv.store.update(_theirs(pair, 0, {1: {"a": 1, "b": 2}}))
  kv.store.update(_theirs("all", 0, {1: 5, 2: 5}))
  kv.store.update(_theirs(pair, 1, {1: [3]}))
  distributed.check_identical("the plan", plan, processes=[1, 0])
  distributed.check_identical("the count", 5)
  distributed.check_identical("the list", [3], processes=[0, 1])
  assert kv.sets == [f"jax_flashoverlap/check/{pair}/0/0", "jax_flashoverlap/check/all/0/0",
                     f"jax_flashoverlap/check/{pair}/1/0"]


def test_check_identical_names_every_value(kv):
  kv.store.update(_theirs("all", 0, {1: 8, 2: 16}))
  with pytest.raises(distributed.DistributedMismatchError) as err:
    distributed.check_identical("comm_sms", 8)
  assert str(err.value).startswith("jax_flashoverlap: comm_sms differs between processes: "
                                   "process 0 has 8, process 2 has 16. Every process"), err.value
