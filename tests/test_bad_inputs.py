"""The bad-input table (issue #8, "Reliability"; documented in docs/errors.md).

One parametrized table, CASES: each row is a bad input somewhere in the public surface (the
per-device ops inside jax.shard_map, the global-view row_parallel_matmul under jit, the Flax
layers, the CLIs, tuned-config files, the multi-process runtime, the GPU / extension checks)
and what must happen:

* Raises(type, *substrings): that exception type, and every substring in its message (the
  substrings name the argument and what was expected).
* Warns(category, *substrings): a warning, and the op then lowers to the reference path
  (XLA's dot + collective, no custom call) instead of failing or running an unsupported kernel.
* Exits(code, *substrings, max_s=...): a CLI run as a subprocess (JAX_PLATFORMS=cpu, with a
  timeout) exits with `code` within `max_s` seconds, the substrings in its output.
* SAME: the input is legal although it looks suspicious (non-contiguous views, a weight
  sharded on another axis): the case returns (ours, XLA's) pairs that must be equal.

Rows marked xfail(strict=True) do not give a clear error today and the fix belongs to a file
this change did not touch; the reason says what should change (docs/errors.md lists them).
Everything runs on CPU (8 simulated devices, tests/conftest.py); nothing here needs a GPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo
from jax_flashoverlap import _compat, _ext, distributed, plan as plan_lib, tuning

from _util import assert_close, make_mesh_1d, make_mesh_2d, shard_map

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16, F16 = jnp.bfloat16, jnp.float16
H200 = "NVIDIA H200"
JaxRuntimeError = jax.errors.JaxRuntimeError


# ----------------------------------------------------------------------------- expectations

@dataclasses.dataclass(frozen=True)
class Raises:
    type: type | tuple
    match: tuple


@dataclasses.dataclass(frozen=True)
class Warns:
    category: type
    match: tuple


@dataclasses.dataclass(frozen=True)
class Exits:
    code: int
    match: tuple
    max_s: float


SAME = "same values as XLA"


def raises(exc, *match):
    return Raises(exc, match)


def warns(category, *match):
    return Warns(category, match)


def exits(code, *match, max_s=60.0):
    return Exits(code, match, max_s)


# ----------------------------------------------------------------------------- helpers

def sds(shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def rand(shape, dtype=BF16, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return jnp.asarray(a, dtype)


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def trace_op(op, x, w, *, n=4, axis="tp", x_spec=P(None, "tp"), w_spec=P("tp", None), **kw):
    """Traces (only) a shard_map over a 1-D 'tp' mesh of n CPU devices calling op `op`."""
    mesh = make_mesh_1d(n)
    if op == "all_reduce":
        body, out = (lambda a, b: fo.matmul_all_reduce(a, b, axis, **kw)), P()
    elif op == "reduce_scatter":
        body, out = (lambda a, b: fo.matmul_reduce_scatter(a, b, axis, **kw)), P("tp")
    else:  # matmul: data parallel, rows of x over tp, w replicated
        body, out = (lambda a, b: fo.matmul(a, b, **kw)), P("tp")
        x_spec, w_spec = P("tp"), P()
    return jax.make_jaxpr(shard_map(body, mesh, (x_spec, w_spec), out))(x, w)


def cuda_lowering_text(op="all_reduce"):
    """StableHLO of a fresh (uncached) shard_map program cross-lowered for CUDA on CPU."""
    mesh = make_mesh_1d(4)
    if op == "all_reduce":
        body = lambda a, b: fo.matmul_all_reduce(a, b, "tp")  # noqa: E731
    else:
        body = lambda a, b: fo.matmul_reduce_scatter(a, b, "tp")  # noqa: E731
    f = shard_map(body, mesh, (P(None, "tp"), P("tp", None)), P() if op == "all_reduce" else P("tp"))
    lowered = jax.jit(f).trace(sds((16, 64)), sds((64, 32))).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


def row_parallel(x, w, **kw):
    return jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, **kw))(x, w)


def rp_inputs(mesh, x_shape=(16, 64), w_shape=(64, 32), x_spec=P(None, "tp"),
              w_spec=P("tp", None)):
    return put(rand(x_shape), mesh, x_spec), put(rand(w_shape, seed=1), mesh, w_spec)


def cli_env():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)  # the conftest's 8 devices are not needed in a CLI
    return env


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def assert_dead(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ----------------------------------------------------------------------------- public ops

def op_float32(t):
    trace_op("all_reduce", sds((8, 64), jnp.float32), sds((64, 32), jnp.float32))


def op_int8(t):
    trace_op("reduce_scatter", sds((8, 64), jnp.int8), sds((64, 32), jnp.int8))


def op_w_float32(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32), jnp.float32))


def op_mixed(t):
    trace_op("matmul", sds((8, 64)), sds((64, 32), F16))


def op_x_rank1(t):
    trace_op("all_reduce", sds((64,)), sds((64, 32)), x_spec=P("tp"))


def op_w_rank3(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32, 8)), w_spec=P("tp", None, None))


def op_rs_x_rank3(t):
    trace_op("reduce_scatter", sds((2, 8, 64)), sds((64, 32)), x_spec=P(None, None, "tp"))


def op_k_mismatch(t):
    trace_op("all_reduce", sds((8, 64)), sds((96, 32)))  # local K 16 vs 24


def op_n_not_multiple_of_8(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 12)))


def op_k_not_multiple_of_8(t):
    trace_op("all_reduce", sds((8, 48)), sds((48, 32)))  # local K = 12


def op_empty_x(t):
    trace_op("all_reduce", sds((0, 64)), sds((64, 32)))


def op_empty_w(t):
    trace_op("matmul", sds((8, 64)), sds((64, 0)))


def op_rs_m_not_divisible(t):
    trace_op("reduce_scatter", sds((6, 64)), sds((64, 32)))


def op_axis_unbound(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), axis="nope")


def op_axis_outside_shard_map(t):
    jax.make_jaxpr(lambda a, b: fo.matmul_all_reduce(a, b, "tp"))(sds((8, 16)), sds((16, 32)))


def op_axis_not_str(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), axis=("tp", 3))


def op_axis_empty(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 32)), axis=())


def op_axis_vmap_name(t):
    mesh = make_mesh_1d(4)

    def body(x, w):
        return jax.vmap(lambda r: fo.matmul_all_reduce(r, w, "b"), axis_name="b")(x)

    jax.make_jaxpr(shard_map(body, mesh, (P(None, None, "tp"), P("tp", None)), P()))(
        sds((2, 8, 64)), sds((64, 32)))


def op_comm_sms_str(t):
    trace_op("all_reduce", sds((8, 64)), sds((64, 32)), comm_sms="8")


def op_comm_sms_bool(t):
    trace_op("matmul", sds((8, 64)), sds((64, 32)), comm_sms=True)


def op_comm_sms_range(t):
    trace_op("reduce_scatter", sds((8, 64)), sds((64, 32)), comm_sms=132)


def op_x_not_array(t):
    fo.matmul([[1.0] * 8], jnp.ones((8, 8), BF16))


# ----------------------------------------------------------------------------- global view

def rp_bad_reduce(t):
    jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce="all_gather")).trace(
        sds((16, 64)), sds((64, 32)))


def rp_axis_not_str(t):
    jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, axis_name=("tp",))).trace(
        sds((16, 64)), sds((64, 32)))


def rp_x_rank3(t):
    jax.jit(fo.row_parallel_matmul).trace(sds((2, 16, 64)), sds((64, 32)))


def rp_axis_unknown(t):
    row_parallel(*rp_inputs(make_mesh_1d(4)), axis_name="model")


def rp_k_two_axes(t):
    mesh = make_mesh_2d(2, 4)
    row_parallel(*rp_inputs(mesh, x_spec=P(None, ("dp", "tp")), w_spec=P(("dp", "tp"), None)))


def rp_rs_m_not_divisible(t):
    row_parallel(*rp_inputs(make_mesh_1d(4), x_shape=(6, 64)), reduce="reduce_scatter")


def rp_local_k_not_multiple_of_8(t):
    # global K = 40 is a multiple of 8, but each of the 8 shards holds K = 5
    row_parallel(*rp_inputs(make_mesh_1d(8), x_shape=(8, 40), w_shape=(40, 16)))


def rp_mesh_mismatch(t):
    devices = jax.devices("cpu")
    mesh_a = Mesh(np.array(devices[:4]), ("tp",))
    mesh_b = Mesh(np.array(devices[4:8]), ("tp",))
    row_parallel(put(rand((16, 64)), mesh_a, P(None, "tp")),
                 put(rand((64, 32)), mesh_b, P("tp", None)))


def rp_w_sharded_on_other_axis(t):
    """w sharded on 'dp' while x's K is sharded on 'tp': legal; XLA reshards w."""
    mesh = make_mesh_2d(2, 4)
    x, w = rp_inputs(mesh, x_spec=P(None, "tp"), w_spec=P("dp", None))
    ref = jax.jit(jnp.matmul)(x, w)
    return [(row_parallel(x, w, reduce=r), ref) for r in ("all_reduce", "reduce_scatter")]


# ----------------------------------------------------------------------------- non-contiguous

def _ours_and_psum(x, w, mesh):
    specs = (P(None, "tp"), P("tp", None)), P()
    ours = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh, *specs))
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a @ b, "tp"), mesh, *specs))
    return ours(x, w), ref(x, w)


def noncontig_transposed(t):
    """x = xt.T and w = wt.T: JAX arrays have no strides, a transpose is a new dense array."""
    mesh = make_mesh_1d(4)
    xt, wt = rand((64, 16)), rand((32, 64), seed=1)
    pairs = [_ours_and_psum(xt.T, wt.T, mesh)]
    # the transpose inside the jitted per-device function (XLA may fold it into the dot)
    specs = (P("tp", None), P(None, "tp")), P()
    ours = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a.T, b.T, "tp"), mesh, *specs))
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a.T @ b.T, "tp"), mesh, *specs))
    pairs.append((ours(xt, wt), ref(xt, wt)))
    return pairs


def noncontig_sliced(t):
    """Strided and offset slices (x[::2, 8:72], w[:, 1::2]) as inputs."""
    mesh = make_mesh_1d(4)
    big_x, big_w = rand((32, 80)), rand((64, 64), seed=1)
    x, w = big_x[::2, 8:72], big_w[:, 1::2]
    assert x.shape == (16, 64) and w.shape == (64, 32)
    return [_ours_and_psum(x, w, mesh)]


# ----------------------------------------------------------------------------- donation

def donated_reuse(t):
    """A donated input is deleted by JAX; passing it to our op again is JAX's own error."""
    mesh = make_mesh_1d(4)
    specs = (P(None, "tp"), P("tp", None)), P()  # local x [16, 8] == local out [16, 8]
    body = lambda a, b: fo.matmul_all_reduce(a, b, "tp")  # noqa: E731
    x, w = put(rand((16, 32)), mesh, specs[0][0]), put(rand((32, 8), seed=1), mesh, specs[0][1])
    ref = jax.jit(shard_map(lambda a, b: lax.psum(a @ b, "tp"), mesh, *specs))(x, w)
    y = jax.jit(shard_map(body, mesh, *specs), donate_argnums=0)(x, w)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))
    assert x.is_deleted(), "the donated buffer was not consumed: the case tests nothing"
    # a fresh jit of our op (calling the same jitted function again: next case)
    jax.jit(shard_map(body, mesh, *specs))(x, w)


_DONATE_SCRIPT = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    specs = (P(None, "tp"), P("tp", None)), P()
    x = jax.device_put(jnp.ones((16, 32), jnp.bfloat16), NamedSharding(mesh, specs[0][0]))
    w = jax.device_put(jnp.ones((32, 8), jnp.bfloat16), NamedSharding(mesh, specs[0][1]))
    f = jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                              in_specs=specs[0], out_specs=specs[1]), donate_argnums=0)
    f(x, w)
    assert x.is_deleted()
    f(x, w)  # the same jitted function again, with the donated (deleted) array
''')


def donated_reuse_same_function(t):
    script = t.tmp_path / "donate.py"
    script.write_text(_DONATE_SCRIPT)
    return subprocess.run([sys.executable, str(script)], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- Flax

def _nnx():
    from flax import nnx
    from jax_flashoverlap import flax as fl
    return nnx, fl


def _linen():
    from jax_flashoverlap import flax as fl
    return fl


def nnx_bad_reduce(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, reduce="all_gather", rngs=nnx.Rngs(0))


def nnx_in_features_not_divisible(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.RowParallelLinear(34, 16, rngs=nnx.Rngs(0))


def nnx_out_features_not_divisible(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.ColumnParallelLinear(32, 18, rngs=nnx.Rngs(0))


def nnx_features_not_positive(t):
    nnx, fl = _nnx()
    fl.ColumnParallelLinear(0, 16, rngs=nnx.Rngs(0))


def nnx_dtype_float32(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, dtype=jnp.float32, rngs=nnx.Rngs(0))


def nnx_axis_not_str(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, axis_name=("tp",), rngs=nnx.Rngs(0))


def nnx_axis_unknown(t):
    nnx, fl = _nnx()
    with jax.set_mesh(make_mesh_1d(4)):  # the mesh has only 'tp'
        fl.RowParallelLinear(32, 16, axis_name="model", rngs=nnx.Rngs(0))


def nnx_x_shape_mismatch(t):
    nnx, fl = _nnx()
    fl.RowParallelLinear(32, 16, rngs=nnx.Rngs(0))(jnp.ones((4, 24), BF16))


def nnx_global_params_in_shard_map(t):
    nnx, fl = _nnx()
    gdef, state = nnx.split(fl.RowParallelLinear(32, 16, rngs=nnx.Rngs(0)))
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4), (P(), P(None, "tp")), P())
    f(state, jnp.ones((4, 32), BF16))


def nnx_rs_rows_not_divisible(t):
    nnx, fl = _nnx()
    gdef, state = nnx.split(fl.RowParallelLinear(32, 16, reduce="reduce_scatter",
                                                 rngs=nnx.Rngs(0)))
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4),
                  (nnx.get_partition_spec(state), P(None, "tp")), P("tp"))
    jax.eval_shape(f, state, sds((6, 32)))


def linen_bad_reduce(t):
    fl = _linen()
    fl.RowParallelDense(16, reduce="bogus").init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_features_not_divisible(t):
    fl = _linen()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.ColumnParallelDense(18).init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_in_features_not_divisible(t):
    fl = _linen()
    mesh3 = Mesh(np.array(jax.devices("cpu")[:3]), ("tp",))
    with jax.set_mesh(mesh3):  # x has 32 input features; 32 % 3 != 0
        fl.RowParallelDense(16).init(jax.random.key(0), jnp.ones((4, 32), BF16))


def linen_axis_unknown(t):
    fl = _linen()
    with jax.set_mesh(make_mesh_1d(4)):
        fl.RowParallelDense(16, axis_name="model").init(jax.random.key(0),
                                                         jnp.ones((4, 32), BF16))


def linen_dtype_int8(t):
    fl = _linen()
    fl.RowParallelDense(16, dtype=jnp.int8).init(jax.random.key(0), jnp.ones((4, 32), BF16))


# ----------------------------------------------------------------------------- tuned configs

def _entry(**kw):
    e = dict(collective="all_reduce", dtype="bfloat16", m=1024, n=512, k=256, comm_sms=16,
             band_rows=[0, 512, 1024])
    e.update(kw)
    return e


def _config(t, body=None, *, raw=None, name="plans.json", **top):
    """Writes a config file (a dict built from the defaults, or `raw` text) and loads it."""
    path = t.tmp_path / name
    if raw is None:
        data = dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry()])
        data.update(top)
        if body is not None:
            data["entries"] = body
        raw = json.dumps(data)
    path.write_text(raw)
    return tuning.load_file(path)


def cfg_not_json(t):
    _config(t, raw="{not json")


def cfg_top_level_not_object(t):
    _config(t, raw="[1, 2]")


def cfg_wrong_schema(t):
    _config(t, schema="jax_flashoverlap.plans/2")


def cfg_missing_gpu(t):
    _config(t, gpu=None)


def cfg_missing_entries(t):
    _config(t, entries=None)


def cfg_entry_missing_field(t):
    e = _entry()
    del e["m"]
    _config(t, [e])


def cfg_world_size_wrong_type(t):
    _config(t, world_size="2")


def cfg_band_rows_wrong_type(t):
    _config(t, [_entry(band_rows=[0, 512.0, 1024])])


def cfg_bands_do_not_sum_to_m(t):
    _config(t, [_entry(band_rows=[0, 512, 1000])])


def cfg_rs_bands_wrong_size(t):
    # reduce-scatter on 2 ranks: bands split one rank's block of m / 2 = 512 rows
    _config(t, [_entry(collective="reduce_scatter", band_rows=[0, 512, 1024])])


def cfg_measured_ms_not_number(t):
    _config(t, [_entry(measured_ms="fast")])


def cfg_missing_file(t):
    tuning.load_file(t.tmp_path / "missing.json")


def cfg_bad_file_at_lowering(t):
    """A broken file in the user config dir fails the plan choice (i.e. the lowering)."""
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(t.tmp_path))
    (t.tmp_path / "plans.json").write_text(json.dumps(
        dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry(comm_sms=500)])))
    plan_lib.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)


def cfg_merge_into_non_json(t):
    path = t.tmp_path / "plans.json"
    path.write_text("not json at all")
    tuning.write_entries(path, H200, 2, [_entry()])


# ----------------------------------------------------------------------------- CLIs

def cli_bench_shapes_malformed(t):
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "12x34")


def cli_bench_shapes_not_integers(t):
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "axbxc")


def cli_bench_shapes_zero(t):
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "0x8x8")


def cli_tune_without_gpu(t):
    return run_cli("jax_flashoverlap.tune", "--shapes", "256x256x256")


def cli_launch_n0(t):
    script = t.tmp_path / "ok.py"
    script.write_text("print('never started')\n")
    return run_cli("jax_flashoverlap.launch", "-n", "0", str(script))


def cli_launch_negative_timeout(t):
    script = t.tmp_path / "ok.py"
    script.write_text("print('never started')\n")
    return run_cli("jax_flashoverlap.launch", "-n", "1", "--timeout", "-1", str(script))


_PID_SCRIPT = textwrap.dedent('''
    import os, sys, time
    me = os.environ["JAX_FLASHOVERLAP_PROCESS_ID"]
    out = sys.argv[1]
    with open(os.path.join(out, "pid" + me), "w") as f:
        f.write(str(os.getpid()))
    if me == "1" and sys.argv[2] == "fail":
        while not os.path.exists(os.path.join(out, "pid0")):  # process 0 is up: it must be killed
            time.sleep(0.05)
        print("process 1 failing", flush=True)
        sys.exit(3)
    time.sleep(120)
''')


def _launch_pids(t, *launch_args, mode):
    script = t.tmp_path / "child.py"
    script.write_text(_PID_SCRIPT)
    r = run_cli("jax_flashoverlap.launch", "-n", "2", *launch_args, str(script),
                str(t.tmp_path), mode, timeout=90)
    for i in (0, 1):  # the launcher left nothing running
        pid_file = t.tmp_path / f"pid{i}"
        assert pid_file.exists(), f"process {i} never started:\n{r.stdout}{r.stderr}"
        assert_dead(int(pid_file.read_text()))
    return r


def cli_launch_child_exits_3(t):
    return _launch_pids(t, "--timeout", "100", mode="fail")


def cli_launch_timeout(t):
    start = time.monotonic()
    r = _launch_pids(t, "--timeout", "5", mode="sleep")
    assert time.monotonic() - start >= 5, "the launcher stopped before its timeout"
    return r


# ----------------------------------------------------------------------------- distributed

_MISMATCH_SCRIPT = textwrap.dedent('''
    import sys
    import jax
    from jax_flashoverlap import distributed
    distributed.initialize()
    me = jax.process_index()
    assert jax.process_count() == 2
    try:  # what the CUDA lowering checks before it uses a plan
        distributed.check_identical("the group plan", {"band_rows": [0, 512, 1024],
                                                       "comm_sms": 8 if me == 0 else 16})
    except distributed.DistributedMismatchError as err:
        print(f"process {me}: {type(err).__name__}: {err}", flush=True)
        sys.exit(0)
    print(f"process {me}: no error", flush=True)
    sys.exit(5)
''')


def dist_plan_mismatch_two_processes(t):
    script = t.tmp_path / "mismatch.py"
    script.write_text(_MISMATCH_SCRIPT)
    return run_cli("jax_flashoverlap.launch", "-n", "2", "--timeout", "60", str(script),
                   timeout=90)


class _FakeKV:
    """JAX's distributed client as far as distributed.py uses it; no other process answers."""

    def __init__(self):
        self.store = {}

    def key_value_set(self, key, value):
        self.store[key] = value

    def blocking_key_value_get(self, key, timeout_ms):
        if key in self.store:
            return self.store[key]
        raise RuntimeError(f"DEADLINE_EXCEEDED: key {key} not found after {timeout_ms} ms")

    def wait_at_barrier(self, key, timeout_ms):
        raise RuntimeError(f"DEADLINE_EXCEEDED: barrier {key} timed out after {timeout_ms} ms")


def _fake_two_processes(t):
    t.monkeypatch.setattr(_compat, "distributed_client", lambda: _FakeKV())
    t.monkeypatch.setattr(jax, "process_count", lambda *a, **k: 2)
    t.monkeypatch.setattr(jax, "process_index", lambda *a, **k: 0)


def dist_peer_never_arrives(t):
    _fake_two_processes(t)
    t.monkeypatch.setenv(distributed.TIMEOUT_ENV, "2")
    distributed.check_identical("the group plan", {"comm_sms": 16})


def dist_bad_timeout_env(t):
    _fake_two_processes(t)
    t.monkeypatch.setenv(distributed.TIMEOUT_ENV, "five minutes")
    distributed.barrier("init/1")


def dist_bad_num_processes_env(t):
    t.monkeypatch.setenv(distributed.COORDINATOR_ENV, "127.0.0.1:1")
    t.monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "two")
    distributed.initialize()


def dist_not_initialized(t):
    distributed.check_identical("the group plan", {"comm_sms": 16})


# ----------------------------------------------------------------------------- GPU / extension

def _no_fallback(t):
    t.monkeypatch.setenv(_ext.FALLBACK_ENV, "0")  # small shapes would take XLA's path anyway
    t.monkeypatch.delenv(_ext.FORCE_REFERENCE_ENV, raising=False)


def gpu_unsupported(kind, capability):
    def case(t):
        _no_fallback(t)
        t.monkeypatch.setattr(_ext, "local_gpus", lambda: [(kind, capability)])
        t.monkeypatch.setattr(_ext, "_warned_unsupported", False)
        use, why = _ext.check_cuda_path("flashoverlap_gemm_all_reduce")
        assert not use and "sm_90" in why, why
        return cuda_lowering_text("all_reduce")
    return case


def ext_missing_with_gpu(t):
    _no_fallback(t)
    t.monkeypatch.setattr(_ext, "local_gpus", lambda: [(H200, "9.0")])
    t.monkeypatch.setattr(_ext, "ext", None)
    t.monkeypatch.setattr(_ext, "EXT_IMPORT_ERROR", "not built (test)")
    t.monkeypatch.setattr(_ext, "_warned_missing", False)
    return cuda_lowering_text("reduce_scatter")


def env_force_reference_typo(t):
    t.monkeypatch.setenv(_ext.FORCE_REFERENCE_ENV, "ture")
    cuda_lowering_text()


def env_watchdog_bad(t):
    from jax_flashoverlap import comm
    t.monkeypatch.setenv(comm.WATCHDOG_ENV, "soon")
    comm.watchdog_seconds()  # read when communicators are made (GPU); checked here directly


def env_fallback_typo(t):
    t.monkeypatch.delenv(_ext.FORCE_REFERENCE_ENV, raising=False)
    t.monkeypatch.setenv(_ext.FALLBACK_ENV, "of")
    cuda_lowering_text()  # a small shape: the cost model predicts no gain, the switch decides


# ----------------------------------------------------------------------------- the table

AXE = fo.AxisNameError
CFG = tuning.ConfigError
DTYPES = "expected one of bfloat16, float16"
XFAIL_JAX_DONATION = pytest.mark.xfail(strict=True, reason=(
    "JAX 0.10.2 (CPU, several devices): calling the same jitted function again with a donated, "
    "deleted sharded array logs 'Buffer has been deleted or donated' and then segfaults; the "
    "same happens with lax.psum(x @ w) and no jax_flashoverlap op (a JAX/XLA bug, cf. "
    "openxla/xla#22604), so the subprocess dies with SIGSEGV instead of a ValueError"))

CASES = [
    # --- public ops inside jax.shard_map (trace time) ---
    pytest.param(op_float32, raises(TypeError, "matmul_all_reduce", "x has dtype float32", DTYPES),
                 id="op-dtype-float32"),
    pytest.param(op_int8, raises(TypeError, "matmul_reduce_scatter", "x has dtype int8", DTYPES),
                 id="op-dtype-int8"),
    pytest.param(op_w_float32, raises(TypeError, "w has dtype float32", DTYPES),
                 id="op-dtype-w-only"),
    pytest.param(op_mixed, raises(TypeError, "jax_flashoverlap.matmul",
                                  "x and w must have the same dtype", "x bfloat16 and w float16"),
                 id="op-dtype-mixed"),
    pytest.param(op_x_rank1, raises(ValueError, "x must have at least 2 dims [..., K]", "(16,)"),
                 id="op-x-rank-1"),
    pytest.param(op_w_rank3, raises(ValueError, "w must be a 2-D weight [K, N]", "(16, 32, 8)"),
                 id="op-w-rank-3"),
    pytest.param(op_rs_x_rank3, raises(ValueError, "matmul_reduce_scatter",
                                       "x must be 2-D [M, K]", "(2, 8, 16)"),
                 id="op-reduce-scatter-x-rank-3"),
    pytest.param(op_k_mismatch, raises(ValueError, "contracting dims differ", "x has K=16",
                                       "w has K=24"), id="op-k-mismatch"),
    pytest.param(op_n_not_multiple_of_8, raises(ValueError, "N (last dim of w) must be a multiple "
                                                "of 8", "N=12"), id="op-n-not-multiple-of-8"),
    pytest.param(op_k_not_multiple_of_8, raises(ValueError, "K (last dim of x, first dim of w) "
                                                "must be a multiple of 8", "K=12"),
                 id="op-k-not-multiple-of-8"),
    pytest.param(op_empty_x, raises(ValueError, "x must not be empty", "(0, 16)"),
                 id="op-empty-x"),
    pytest.param(op_empty_w, raises(ValueError, "w must not be empty", "(64, 0)"),
                 id="op-empty-w"),
    pytest.param(op_rs_m_not_divisible, raises(ValueError, "M (first dim of x", "divisible by the "
                                               "size 4 of axis 'tp'", "M=6"),
                 id="op-reduce-scatter-m-not-divisible"),
    pytest.param(op_axis_unbound, raises(AXE, "axis_name 'nope' is not bound",
                                         "the bound axes are ('tp',)"), id="op-axis-unbound"),
    pytest.param(op_axis_outside_shard_map, raises(AXE, "axis_name 'tp' is not bound",
                                                   "call it inside jax.shard_map"),
                 id="op-axis-outside-shard-map"),
    pytest.param(op_axis_not_str, raises(TypeError, "axis_name must be a mesh axis name (str)",
                                         "('tp', 3)"), id="op-axis-not-str"),
    pytest.param(op_axis_empty, raises(AXE, "axis_name must name at least one mesh axis", "()"),
                 id="op-axis-empty"),
    pytest.param(op_axis_vmap_name, raises(AXE, "axis_name 'b' is not an axis of the enclosing "
                                           "mesh ('tp',)", "vmap axis names are not supported"),
                 id="op-axis-vmap-name"),
    pytest.param(op_comm_sms_str, raises(TypeError, "comm_sms must be an int or None", "'8'"),
                 id="op-comm-sms-str"),
    pytest.param(op_comm_sms_bool, raises(TypeError, "comm_sms must be an int or None", "True"),
                 id="op-comm-sms-bool"),
    pytest.param(op_comm_sms_range, raises(ValueError, "comm_sms must be in [0, 132)", "132"),
                 id="op-comm-sms-out-of-range"),
    pytest.param(op_x_not_array, raises(TypeError, "x must be an array", "list"),
                 id="op-x-not-an-array"),
    # --- row_parallel_matmul under jit (global view) ---
    pytest.param(rp_bad_reduce, raises(ValueError, "row_parallel_matmul", "reduce must be one of "
                                       "('all_reduce', 'reduce_scatter')", "'all_gather'"),
                 id="rp-bad-reduce"),
    pytest.param(rp_axis_not_str, raises(TypeError, "axis_name must be a mesh axis name (str) or "
                                         "None", "('tp',)"), id="rp-axis-not-str"),
    pytest.param(rp_x_rank3, raises(ValueError, "row_parallel_matmul", "x must be 2-D [M, K]"),
                 id="rp-x-rank-3"),
    # raised in the custom partitioner: XLA wraps the ValueError, its message is kept
    pytest.param(rp_axis_unknown, raises(JaxRuntimeError, "ValueError", "axis_name 'model' is "
                                         "not an axis of the mesh ('tp',)"),
                 id="rp-axis-unknown"),
    pytest.param(rp_k_two_axes, raises(JaxRuntimeError, "K is sharded over several mesh axes "
                                       "('dp', 'tp')", "pass axis_name"),
                 id="rp-k-sharded-over-two-axes"),
    pytest.param(rp_rs_m_not_divisible, raises(JaxRuntimeError, "reduce_scatter needs the rows of "
                                               "each shard (6) to be divisible by the size 4 of "
                                               "axis 'tp'"),
                 id="rp-reduce-scatter-m-not-divisible"),
    pytest.param(rp_local_k_not_multiple_of_8, raises(JaxRuntimeError, "must be a multiple of 8",
                                                      "K=5"),
                 id="rp-local-k-not-multiple-of-8"),
    pytest.param(rp_mesh_mismatch, raises(ValueError, "incompatible devices", "device ids [0, 1, "
                                          "2, 3]", "[4, 5, 6, 7]"), id="rp-mesh-mismatch"),
    pytest.param(rp_w_sharded_on_other_axis, SAME, id="rp-w-sharded-on-other-axis"),
    # --- "non-contiguous" inputs and donated buffers ---
    pytest.param(noncontig_transposed, SAME, id="noncontiguous-transposed"),
    pytest.param(noncontig_sliced, SAME, id="noncontiguous-sliced"),
    pytest.param(donated_reuse, raises(RuntimeError, "Array has been deleted",
                                       "bfloat16[16,32]"), id="donated-buffer-reused"),
    pytest.param(donated_reuse_same_function, exits(1, "deleted or donated"),
                 id="donated-buffer-reused-same-jit", marks=XFAIL_JAX_DONATION),
    # --- Flax layers ---
    pytest.param(nnx_bad_reduce, raises(ValueError, "RowParallelLinear: reduce must be one of",
                                        "'all_gather'"), id="nnx-bad-reduce"),
    pytest.param(nnx_in_features_not_divisible, raises(ValueError, "RowParallelLinear: "
                                                       "in_features=34 is not divisible by the "
                                                       "size 4 of mesh axis 'tp'"),
                 id="nnx-in-features-not-divisible"),
    pytest.param(nnx_out_features_not_divisible, raises(ValueError, "ColumnParallelLinear: "
                                                        "out_features=18 is not divisible by the "
                                                        "size 4"),
                 id="nnx-out-features-not-divisible"),
    pytest.param(nnx_features_not_positive, raises(ValueError, "in_features must be a positive "
                                                   "int, got 0"),
                 id="nnx-features-not-positive"),
    pytest.param(nnx_dtype_float32, raises(TypeError, "RowParallelLinear: dtype=",
                                           "only bfloat16 and float16"), id="nnx-dtype-float32"),
    pytest.param(nnx_axis_not_str, raises(TypeError, "axis_name must be a mesh axis name (str)",
                                          "('tp',)"), id="nnx-axis-not-str"),
    pytest.param(nnx_axis_unknown, raises(ValueError, "RowParallelLinear", "'model'", "('tp',)"),
                 id="nnx-axis-not-in-mesh"),
    pytest.param(nnx_x_shape_mismatch, raises(ValueError, "x (4, 24) and kernel (32, 16) do not "
                                              "match", "expected x [..., 32]"),
                 id="nnx-x-shape-mismatch"),
    pytest.param(nnx_global_params_in_shard_map, raises(ValueError, "do not match",
                                                        "inside shard_map over 'tp'"),
                 id="nnx-global-params-inside-shard-map"),
    pytest.param(nnx_rs_rows_not_divisible, raises(ValueError, "reduce='reduce_scatter' needs the "
                                                   "first dim of x", "divisible by the size 4"),
                 id="nnx-reduce-scatter-rows-not-divisible"),
    pytest.param(linen_bad_reduce, raises(ValueError, "RowParallelDense: reduce must be one of",
                                          "'bogus'"), id="linen-bad-reduce"),
    pytest.param(linen_features_not_divisible, raises(ValueError, "ColumnParallelDense: "
                                                      "out_features=18 is not divisible by the "
                                                      "size 4"),
                 id="linen-features-not-divisible"),
    pytest.param(linen_in_features_not_divisible, raises(ValueError, "RowParallelDense",
                                                         "in_features=32 is not divisible by the "
                                                         "size 3"),
                 id="linen-in-features-not-divisible"),
    pytest.param(linen_axis_unknown, raises(ValueError, "RowParallelDense: axis_name 'model' is "
                                            "not an axis of the mesh ('tp',)"),
                 id="linen-axis-not-in-mesh"),
    pytest.param(linen_dtype_int8, raises(TypeError, "RowParallelDense: dtype=",
                                          "only bfloat16 and float16"), id="linen-dtype-int8"),
    # --- tuned-config files ---
    pytest.param(cfg_not_json, raises(CFG, "plans.json", "not JSON"), id="config-not-json"),
    pytest.param(cfg_top_level_not_object, raises(CFG, "plans.json", "top level must be a JSON "
                                                  "object"), id="config-not-an-object"),
    pytest.param(cfg_wrong_schema, raises(CFG, "plans.json", "'schema' must be "
                                          "'jax_flashoverlap.plans/1'",
                                          "got 'jax_flashoverlap.plans/2'"),
                 id="config-wrong-schema-version"),
    pytest.param(cfg_missing_gpu, raises(CFG, "plans.json", "'gpu' must be the GPU's device_kind"),
                 id="config-missing-gpu"),
    pytest.param(cfg_missing_entries, raises(CFG, "plans.json", "'entries' must be a list"),
                 id="config-missing-entries"),
    pytest.param(cfg_entry_missing_field, raises(CFG, "plans.json", "entries[0]: 'm' must be an "
                                                 "integer, got None"),
                 id="config-entry-missing-field"),
    pytest.param(cfg_world_size_wrong_type, raises(CFG, "plans.json", "'world_size' must be an "
                                                   "integer, got '2'"),
                 id="config-world-size-wrong-type"),
    pytest.param(cfg_band_rows_wrong_type, raises(CFG, "plans.json", "entries[0]: 'band_rows' "
                                                  "must be a list of at least 2 integers"),
                 id="config-band-rows-wrong-type"),
    pytest.param(cfg_bands_do_not_sum_to_m, raises(CFG, "plans.json", "band_rows (0, 512, 1000) "
                                                   "must start at 0 and end at 1024"),
                 id="config-bands-do-not-sum-to-m"),
    pytest.param(cfg_rs_bands_wrong_size, raises(CFG, "plans.json", "must start at 0 and end at "
                                                 "512"),
                 id="config-reduce-scatter-bands-wrong-size"),
    pytest.param(cfg_measured_ms_not_number, raises(CFG, "plans.json", "'measured_ms' must be a "
                                                    "non-negative number", "'fast'"),
                 id="config-measured-ms-wrong-type"),
    pytest.param(cfg_missing_file, raises(CFG, "missing.json", "cannot read tuned-config file"),
                 id="config-file-missing"),
    pytest.param(cfg_bad_file_at_lowering, raises(CFG, "plans.json", "comm_sms", "500"),
                 id="config-bad-file-fails-the-plan-choice"),
    pytest.param(cfg_merge_into_non_json, raises(CFG, "plans.json", "not JSON"),
                 id="config-merge-into-non-json"),
    # --- CLIs (subprocesses, JAX_PLATFORMS=cpu) ---
    pytest.param(cli_bench_shapes_malformed, exits(2, "argument --shapes", "shape must be MxNxK",
                                                   "got '12x34'"),
                 id="cli-bench-shapes-malformed"),
    pytest.param(cli_bench_shapes_not_integers, exits(2, "argument --shapes", "MxNxK", "'axbxc'"),
                 id="cli-bench-shapes-not-integers"),
    pytest.param(cli_bench_shapes_zero, exits(2, "argument --shapes", "positive", "'0x8x8'"),
                 id="cli-bench-shapes-zero"),
    pytest.param(cli_tune_without_gpu, exits(2, "needs GPUs", "'cpu'"),
                 id="cli-tune-without-gpu"),
    pytest.param(cli_launch_n0, exits(2, "-n must be >= 1"), id="cli-launch-n-0"),
    pytest.param(cli_launch_negative_timeout, exits(2, "--timeout must be a positive number of "
                                                    "seconds", "-1"),
                 id="cli-launch-negative-timeout"),
    pytest.param(cli_launch_child_exits_3, exits(3, "process 1 exited with 3; stopping the others",
                                                 "process 1 failing", max_s=40),
                 id="cli-launch-child-exits-3"),
    pytest.param(cli_launch_timeout, exits(124, "timeout after 5 s", max_s=40),
                 id="cli-launch-timeout"),
    # --- several processes ---
    pytest.param(dist_plan_mismatch_two_processes, exits(0, "process 0: DistributedMismatchError",
                                                         "the group plan differs between "
                                                         "processes", "process 1 has", max_s=80),
                 id="dist-plan-mismatch-2-processes"),
    pytest.param(dist_peer_never_arrives, raises(TimeoutError, "waited 2 s for process 1's value "
                                                 "of the group plan",
                                                 distributed.TIMEOUT_ENV),
                 id="dist-peer-never-arrives"),
    pytest.param(dist_bad_timeout_env, raises(ValueError, distributed.TIMEOUT_ENV,
                                              "'five minutes'", "positive number of seconds"),
                 id="dist-bad-kv-timeout-env"),
    pytest.param(dist_bad_num_processes_env, raises(ValueError, distributed.NUM_PROCESSES_ENV,
                                                    "'two'", "must be an integer"),
                 id="dist-bad-num-processes-env"),
    pytest.param(dist_not_initialized, raises(RuntimeError, "needs JAX's distributed runtime",
                                              "jax.distributed.initialize()"),
                 id="dist-not-initialized"),
    # --- unsupported GPU, missing extension, switches ---
    pytest.param(gpu_unsupported("NVIDIA A100-SXM4-80GB", "8.0"),
                 warns(_ext.UnsupportedGPUWarning, "needs an sm_90 GPU", "'NVIDIA A100-SXM4-80GB' "
                       "is sm_80", "reference path"), id="gpu-unsupported-sm80"),
    pytest.param(gpu_unsupported("NVIDIA B200", "10.0"),
                 warns(_ext.UnsupportedGPUWarning, "needs an sm_90 GPU", "is sm_100"),
                 id="gpu-unsupported-sm100"),
    pytest.param(ext_missing_with_gpu, warns(_ext.ExtensionMissingWarning, "a GPU is present but "
                                             "the CUDA extension is not built", "not built (test)"),
                 id="extension-missing-with-gpu"),
    pytest.param(env_force_reference_typo, raises(ValueError, _ext.FORCE_REFERENCE_ENV, "'ture'",
                                                  "is not an on/off switch"),
                 id="env-force-reference-typo"),
    pytest.param(env_fallback_typo, raises(ValueError, _ext.FALLBACK_ENV, "'of'",
                                           "is not an on/off switch"),
                 id="env-fallback-typo"),
    pytest.param(env_watchdog_bad, raises(ValueError, "JAX_FLASHOVERLAP_WATCHDOG_S must be a "
                                          "number of seconds > 0", "'soon'"),
                 id="env-watchdog-not-a-number"),
]

CUSTOM_CALLS = ("flashoverlap_gemm_all_reduce", "flashoverlap_gemm_reduce_scatter")


def _has_all(text, needles, what):
    missing = [s for s in needles if s not in text]
    assert not missing, f"{what} lacks {missing}:\n{text[-4000:]}"


@pytest.mark.parametrize("case, expect", CASES)
def test_bad_input(case, expect, monkeypatch, tmp_path):
    t = types.SimpleNamespace(monkeypatch=monkeypatch, tmp_path=tmp_path)
    if isinstance(expect, Raises):
        with pytest.raises(expect.type) as info:
            case(t)
        _has_all(str(info.value), expect.match, f"the {type(info.value).__name__} message")
    elif isinstance(expect, Warns):
        with pytest.warns(expect.category) as record:
            text = case(t)
        messages = "\n".join(str(w.message) for w in record if issubclass(w.category,
                                                                          expect.category))
        _has_all(messages, expect.match, "the warning")
        # ...and the op took the reference path: XLA's dot + collective, no custom call
        assert not any(c in text for c in CUSTOM_CALLS), "custom call emitted anyway"
        assert "stablehlo.dot_general" in text
        assert "all_reduce" in text or "reduce_scatter" in text
    elif isinstance(expect, Exits):
        start = time.monotonic()
        result = case(t)
        elapsed = time.monotonic() - start
        out = result.stdout + result.stderr
        assert result.returncode == expect.code, f"exit {result.returncode}:\n{out[-4000:]}"
        _has_all(out, expect.match, "the output")
        assert elapsed < expect.max_s, f"took {elapsed:.1f} s (limit {expect.max_s} s)"
    else:
        assert expect is SAME
        pairs = case(t)
        assert pairs
        for ours, ref in pairs:
            assert ours.shape == ref.shape and ours.dtype == ref.dtype
            assert_close(ours, ref)
            np.testing.assert_array_equal(np.asarray(ours, np.float32),
                                          np.asarray(ref, np.float32))


def test_table_size():
    """The issue asks for at least 20 distinct bad inputs; ids are unique."""
    ids = [p.id for p in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 25
