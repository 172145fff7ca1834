"""The per-group trace (jax_flashoverlap.trace, xla_ffi/comm/trace.h) of real overlapped calls:
one record per call per device, every time ordered as the streams order it, the ring's
capacity, nothing recorded while off, and the values unchanged by tracing. The mesh is every
GPU of the machine (one GPU: 1-rank communicators, the same handlers and NCCL calls)."""
import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS

GROUPS = 4
M, K, N = 2048, 4096, 2048


@pytest.fixture(autouse=True)
def _our_kernels_trace_off(monkeypatch):
    U.use_our_kernels(monkeypatch)
    from jax_flashoverlap import trace
    trace.disable()
    trace.read(clear=True)
    yield
    trace.disable()
    trace.read(clear=True)


def _program(op):
    """(jitted op over every GPU, x, w, FFI target, result rows per device)."""
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    ins = (P(None, "tp"), P("tp", None))
    if op == "all_reduce":
        body, out, target = (lambda x, w: fo.matmul_all_reduce(x, w, "tp")), P(), \
            "flashoverlap_gemm_all_reduce"
    else:
        body, out, target = (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp")), P("tp", None), \
            "flashoverlap_gemm_reduce_scatter"
    kx, kw = jax.random.split(jax.random.key(7))
    x = jax.device_put(U.normal(kx, (M, K)), NamedSharding(mesh, ins[0]))
    w = jax.device_put(U.normal(kw, (K, N), 1.0 / np.sqrt(K)), NamedSharding(mesh, ins[1]))
    rows = M if op == "all_reduce" else M // U.N_GPUS
    return jax.jit(shard_map(body, mesh, ins, out)), x, w, target, rows


def _check_record(r, op, target, rows):
    assert r["op"] == target
    assert r["world_size"] == U.N_GPUS and 0 <= r["rank"] < U.N_GPUS
    groups = len(r["band_rows"]) - 1
    assert groups == GROUPS, r["band_rows"]
    assert r["band_rows"][0] == 0 and r["band_rows"][-1] == rows
    assert len(r["ready_ms"]) == len(r["comm_done_ms"]) == len(r["comm_ms"]) == groups
    assert r["gemm_done_ms"] > 0
    ready, done = r["ready_ms"], r["comm_done_ms"]
    assert min(ready) >= 0
    for g in range(groups):
        assert ready[g] <= done[g], (g, r)
        if g:
            assert done[g - 1] <= done[g], (g, r)
            assert done[g - 1] <= ready[g], (g, r)  # one stream: group g waits for g-1
    assert min(r["comm_ms"]) >= 0
    if op == "all_reduce":
        copies = r["copy_done_ms"]
        assert len(copies) == groups
        for g in range(groups):
            assert copies[g] >= done[g], (g, r)
            assert g == 0 or copies[g - 1] <= copies[g], (g, r)
    else:
        assert r["copy_done_ms"] is None


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_trace_of_each_call_then_nothing_when_off(op):
    from jax_flashoverlap import plan, trace
    f, x, w, target, rows = _program(op)
    calls = 3
    with plan.forced(num_groups=GROUPS):
        U.assert_custom_call(f, (x, w), target)
        plain = np.asarray(f(x, w), np.float32)  # compiled and communicators made: untraced
        assert trace.read() == []
        with trace.recording():
            ys = [f(x, w) for _ in range(calls)]
            jax.block_until_ready(ys)
        records = trace.read()
        assert not trace.enabled()

        assert len(records) == calls * U.N_GPUS
        for device in {r["device"] for r in records}:
            assert sum(r["device"] == device for r in records) == calls
        for r in records:
            _check_record(r, op, target, rows)
        for y in ys:  # tracing changes no value
            np.testing.assert_array_equal(np.asarray(y, np.float32), plain)
        text = trace.summarize(records)
        assert len(text.splitlines()) == len(records) + 1 and target in text

        f(x, w).block_until_ready()  # off again: nothing recorded
        assert trace.read() == [] and trace.dropped() == 0


def test_ring_keeps_the_last_calls_and_counts_the_dropped():
    from jax_flashoverlap import plan, trace
    f, x, w, target, rows = _program("all_reduce")
    with plan.forced(num_groups=GROUPS):
        f(x, w).block_until_ready()
        with trace.recording(capacity=2):
            for _ in range(5):
                f(x, w)
            f(x, w).block_until_ready()
        kept = trace.read(clear=False)  # 6 calls, 2 kept per device
        assert len(kept) == 2 * U.N_GPUS and trace.dropped() == 4 * U.N_GPUS
        assert len(trace.read(clear=False)) == len(kept)  # not cleared
        for r in kept:
            _check_record(r, "all_reduce", target, rows)
        assert len(trace.read(clear=True)) == len(kept)
        assert trace.read() == [] and trace.dropped() == 0
