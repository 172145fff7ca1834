"""jax_flashoverlap.trace without a GPU: argument checks, the error without the CUDA extension,
FLASHOVERLAP_TRACE, the derived per-group times and summarize() on hand-made records. The
recording itself is tested on the GPU (test_gpu_trace.py)."""
import pytest

from jax_flashoverlap import _ext, trace


class FakeExt:
    """Stands in for the extension: records the switch, returns given records."""

    def __init__(self, records=()):
        self.calls, self.on, self.records = [], False, list(records)

    def set_trace(self, enabled, capacity):
        self.calls.append((enabled, capacity))
        self.on = enabled

    def trace_enabled(self):
        return self.on

    def read_trace(self, clear):
        out = [dict(r) for r in self.records]
        if clear:
            self.records = []
        return out

    def trace_dropped(self):
        return 3


@pytest.fixture
def fake(monkeypatch):
    ext = FakeExt()
    monkeypatch.setattr(_ext, "ext", ext)
    monkeypatch.setattr(trace, "_env_read", False)
    monkeypatch.setattr(trace, "_capacity", trace.DEFAULT_CAPACITY)
    return ext


@pytest.fixture
def no_extension(monkeypatch):
    monkeypatch.setattr(_ext, "ext", None)
    monkeypatch.setattr(_ext, "EXT_IMPORT_ERROR", "not built (test)")


def AR(gemm=1.0, ready=(1.0, 1.5), done=(2.0, 3.0), copies=(2.5, 3.25)):
    return {"op": "flashoverlap_gemm_all_reduce", "device": 0, "rank": 0, "world_size": 2,
            "comm_sms": 16, "band_rows": [0, 128, 256], "gemm_done_ms": gemm,
            "ready_ms": list(ready), "comm_done_ms": list(done),
            "copy_done_ms": None if copies is None else list(copies)}


# ------------------------------------------------------------------ arguments

@pytest.mark.parametrize("capacity", [0, -1, (1 << 20) + 1, 2.0, True, "8", None])
def test_enable_rejects_bad_capacity(fake, capacity):
    with pytest.raises(ValueError, match="capacity"):
        trace.enable(capacity)
    assert fake.calls == []


@pytest.mark.parametrize("capacity", [1, 256, 1 << 20])
def test_enable_accepts_capacity_range(fake, capacity):
    trace.enable(capacity)
    assert fake.calls == [(True, capacity)] and trace.enabled()


@pytest.mark.parametrize("clear", ["yes", 1, None])
def test_read_rejects_non_bool_clear(fake, clear):
    with pytest.raises(ValueError, match="clear"):
        trace.read(clear)


def test_disable_keeps_the_capacity(fake):
    trace.enable(8)
    trace.disable()
    assert fake.calls == [(True, 8), (False, 8)] and not trace.enabled()


def test_recording_turns_on_then_off(fake):
    with trace.recording(capacity=4):
        assert trace.enabled()
    assert not trace.enabled() and fake.calls == [(True, 4), (False, 4)]


def test_recording_leaves_tracing_on_if_it_was(fake):
    trace.enable()
    with trace.recording():
        pass
    assert trace.enabled()


def test_recording_turns_off_after_an_exception(fake):
    with pytest.raises(KeyError):
        with trace.recording():
            raise KeyError("x")
    assert not trace.enabled()


# ------------------------------------------------------------------ without the extension

def test_enable_without_extension_says_tracing_needs_it(no_extension):
    with pytest.raises(RuntimeError, match="tracing needs the CUDA extension"):
        trace.enable()
    with pytest.raises(RuntimeError, match="tracing needs the CUDA extension"):
        with trace.recording():
            pass


def test_read_disable_dropped_without_extension_are_harmless(no_extension):
    trace.disable()
    assert trace.read() == [] and trace.dropped() == 0 and not trace.enabled()


def test_real_extension_switch_without_gpu():
    """The built extension's switch and an empty read need no GPU (no event is touched)."""
    if _ext.ext is None:
        pytest.skip("the CUDA extension is not built here")
    try:
        with trace.recording(capacity=2):
            assert trace.enabled()
            assert trace.read(clear=False) == []
        assert not trace.enabled()
        with pytest.raises(ValueError, match="capacity"):
            _ext.ext.set_trace(True, 0)
    finally:
        trace.disable()


# ------------------------------------------------------------------ FLASHOVERLAP_TRACE

@pytest.mark.parametrize("value, on", [("1", True), ("on", True), ("0", False), ("", False)])
def test_env_switch_read_once(fake, monkeypatch, value, on):
    monkeypatch.setenv(trace.TRACE_ENV, value)
    trace.apply_env()
    assert trace.enabled() is on
    trace.disable()
    monkeypatch.setenv(trace.TRACE_ENV, "1")
    trace.apply_env()  # read once: no second look
    assert not trace.enabled()


def test_env_switch_typo_is_an_error(fake, monkeypatch):
    monkeypatch.setenv(trace.TRACE_ENV, "yes please")
    with pytest.raises(ValueError, match=trace.TRACE_ENV):
        trace.apply_env()
    assert fake.calls == []


def test_explicit_disable_wins_over_env(fake, monkeypatch):
    monkeypatch.setenv(trace.TRACE_ENV, "1")
    trace.disable()
    trace.apply_env()
    assert not trace.enabled()


# ------------------------------------------------------------------ derived times

def test_group_comm_ms_starts_at_the_later_of_ready_and_previous_group():
    # group 1 ready at 1.5 but the stream busy until 2.0; group 2 ready after group 1 ended
    got = trace.group_comm_ms([1.0, 1.5, 4.0], [2.0, 3.0, 5.5])
    assert got == pytest.approx([1.0, 1.0, 1.5])
    assert trace.group_comm_ms([], []) == []
    with pytest.raises(ValueError, match="groups"):
        trace.group_comm_ms([1.0], [2.0, 3.0])


def test_read_adds_comm_ms(fake):
    fake.records = [AR()]
    (r,) = trace.read(clear=False)
    assert r["comm_ms"] == pytest.approx([1.0, 1.0])
    assert len(trace.read()) == 1 and trace.read() == []
    assert trace.dropped() == 3


def test_end_and_tail():
    assert trace.call_end_ms(AR()) == 3.25                   # the last copy
    assert trace.call_end_ms(AR(copies=None)) == 3.0          # reduce-scatter: its NCCL call
    assert trace.exposed_tail_ms(AR(gemm=2.5)) == pytest.approx(0.75)
    assert trace.exposed_tail_ms(AR(gemm=None)) is None       # no GEMM (collective alone)


def test_summarize_one_line_per_call():
    rs = dict(AR(gemm=2.0, copies=None), op="flashoverlap_gemm_reduce_scatter", device=1, rank=1)
    alone = dict(AR(gemm=None), op="flashoverlap_collective")
    text = trace.summarize([AR(), rs, alone])
    lines = text.splitlines()
    assert len(lines) == 4 and "gemm_done_ms" in lines[0] and "tail_ms" in lines[0]
    assert lines[1].split()[-3:] == ["1.000", "3.250", "2.250"]
    assert lines[2].split()[0] == "flashoverlap_gemm_reduce_scatter"
    assert lines[2].split()[1:4] == ["1", "1", "2"]
    assert lines[2].split()[-3:] == ["2.000", "3.000", "1.000"]
    assert lines[3].split()[-3:] == ["-", "3.250", "-"]
    assert trace.summarize([]) == "no traced calls"


def test_public_reexport(fo):
    assert fo.trace is trace
    for name in ("enable", "disable", "read", "recording", "summarize", "group_comm_ms"):
        assert callable(getattr(fo.trace, name))


# --- medians over calls (jax_flashoverlap.trace.medians; benchmarks/trace_op.py, bench) ----

def _trace_op():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "trace_op.py")
    spec = importlib.util.spec_from_file_location("trace_op", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_medians_per_group():
    from jax_flashoverlap import trace
    recs = []
    for shift in (0.0, 1.0, 0.2):  # three calls; medians are the middle one (shift 0.2)
        r = {"band_rows": [0, 100, 300], "gemm_done_ms": 2.0 + shift,
             "ready_ms": [0.5 + shift, 1.5 + shift], "comm_done_ms": [1.0 + shift, 2.5 + shift],
             "copy_done_ms": [1.2 + shift, 2.7 + shift]}
        r["comm_ms"] = trace.group_comm_ms(r["ready_ms"], r["comm_done_ms"])
        recs.append(r)
    s = trace.medians(recs)
    assert s["calls"] == 3 and s["gemm_done_ms"] == pytest.approx(2.2)
    assert s["ready_ms"] == pytest.approx([0.7, 1.7]) and s["comm_ms"] == pytest.approx([0.5, 1.0])
    assert s["end_ms"] == pytest.approx(2.9) and s["copy_done_ms"] == pytest.approx([1.4, 2.9])
    text = trace.medians_table(s)
    assert "exposed tail   0.700 ms" in text and len(text.splitlines()) == 4
    rs = [dict(r, copy_done_ms=None) for r in recs]
    assert trace.medians(rs)["copy_done_ms"] is None
    assert trace.medians(rs)["end_ms"] == pytest.approx(2.7)
    assert trace.medians(recs[:2])["gemm_done_ms"] == pytest.approx(2.5)  # even count: mean
    with pytest.raises(ValueError, match="no records"):
        trace.medians([])
    with pytest.raises(ValueError, match="different group counts"):
        trace.medians([recs[0], dict(recs[1], band_rows=[0, 300])])


def test_trace_op_refuses_without_gpu(capsys):
    mod = _trace_op()
    import jax
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    assert mod.main(["--shape", "256x256x256"]) == 2
    assert "needs GPUs" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--groups", "0"], "--groups must be >= 1"),
    (["--comm-sms", "-1"], "--comm-sms must be >= 0 and <= 130, got -1"),
    # plan.forced()'s upper bounds (64 groups, 130 SMs: the GEMM keeps 2): a traceback after
    # the GPU check before
    (["--groups", "65"], "--groups must be >= 1 and <= 64 (leave it out for the op's own plan), "
                         "got 65"),
    (["--comm-sms", "131"], "--comm-sms must be >= 0 and <= 130, got 131"),
])
def test_trace_op_refuses_bad_plan_arguments_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        _trace_op().main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_trace_op_takes_comm_sms_0(capsys):
    # 0 SMs for the communication is a plan (NCCL's own choice), not a bad argument: past the
    # argument checks it stops only for the missing GPU
    import jax
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    assert _trace_op().main(["--comm-sms", "0", "--groups", "1", "--shape", "256x256x256"]) == 2
    assert "needs GPUs" in capsys.readouterr().err


def test_bench_traced_calls_groups_medians_by_device(monkeypatch):
    """bench overlap --trace: N isolated calls under the trace, medians per device (the trace
    module's extension calls replaced by a recorder here; the GPU path is the same code)."""
    from jax_flashoverlap import bench, trace

    calls = []

    class Out:
        def block_until_ready(self):
            return self

    def fn(x):
        calls.append(x)
        return Out()

    def record(device, shift):
        r = {"device": device, "band_rows": [0, 64, 128], "gemm_done_ms": 1.0 + shift,
             "ready_ms": [0.4 + shift, 1.0 + shift], "comm_done_ms": [0.6 + shift, 1.2 + shift],
             "copy_done_ms": None}
        r["comm_ms"] = trace.group_comm_ms(r["ready_ms"], r["comm_done_ms"])
        return r

    state = {"on": False, "reads": 0}
    monkeypatch.setattr(trace, "available", lambda: True)
    monkeypatch.setattr(trace, "enabled", lambda: state["on"])
    monkeypatch.setattr(trace, "enable", lambda capacity=256: state.update(on=True))
    monkeypatch.setattr(trace, "disable", lambda: state.update(on=False))

    def read(clear=True):
        state["reads"] += 1
        if state["reads"] == 1:  # the clearing read before recording
            return []
        return [record(d, s) for s in (0.0, 0.1, 0.2) for d in (0, 1)]

    monkeypatch.setattr(trace, "read", read)
    out = bench.traced_calls(fn, ("x",), 3)
    assert calls == ["x"] * 3 and not state["on"]
    assert sorted(out) == ["0", "1"]
    assert out["0"]["calls"] == 3 and out["0"]["gemm_done_ms"] == pytest.approx(1.1)
    assert out["1"]["end_ms"] == pytest.approx(1.3)
    assert bench.traced_calls(fn, ("x",), 0) == {}
    monkeypatch.setattr(trace, "available", lambda: False)
    assert bench.traced_calls(fn, ("x",), 3) == {}


def test_enable_off_gpu_says_nothing_will_be_recorded(fake, monkeypatch):
    """With the extension built but JAX on the CPU, tracing was on and read() stayed empty
    without a word."""
    monkeypatch.setattr(trace, "_warned_backends", set())
    with pytest.warns(RuntimeWarning, match="backend here is 'cpu'.*no call is traced"):
        trace.enable(8)
    assert fake.on


def test_enable_off_gpu_warns_once_per_backend(fake, monkeypatch):
    """The notice comes at the first enable() on a backend, not at every one (a loop of
    `with trace.recording():` blocks printed it each time)."""
    import warnings
    monkeypatch.setattr(trace, "_warned_backends", set())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trace.enable(8)
        trace.disable()
        with trace.recording(capacity=16):
            pass
    notices = [str(w.message) for w in said if "no call is traced" in str(w.message)]
    assert len(notices) == 1, notices
    assert fake.calls == [(True, 8), (False, 8), (True, 16), (False, 16)]


def test_enable_and_recording_pass_their_capacity_and_win_over_env(fake, monkeypatch):
    """An explicit enable(8) wins over FLASHOVERLAP_TRACE (read no more, not re-enabled at its
    default capacity); recording(capacity) gives the extension that capacity."""
    trace.enable(8)
    monkeypatch.setenv(trace.TRACE_ENV, "1")
    trace.apply_env()
    assert fake.calls == [(True, 8)]
    trace.disable()
    with trace.recording(capacity=16):
        assert fake.calls[-1] == (True, 16)


def test_env_switch_unset_is_off(fake, monkeypatch):
    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    trace.apply_env()
    assert fake.calls == [] and not trace.enabled()


def test_call_end_is_the_latest_group_end():
    """The last group's end is the latest one, also when copies finished out of order; no
    groups: 0."""
    assert trace.call_end_ms(AR(copies=(3.5, 3.25))) == 3.5
    assert trace.call_end_ms(AR(done=(2.0, 1.75), copies=None)) == 2.0
    assert trace.call_end_ms(AR(ready=(), done=(), copies=None)) == 0.0
    assert "0.000" in trace.summarize([AR(gemm=None, ready=(), done=(), copies=None)])


def test_medians_skip_calls_without_a_field_and_table_rows():
    """A call without copies leaves the others' copy medians; the table gives each group's
    row count and the exposed tail (end - GEMM end)."""
    recs = [{"band_rows": [0, 100, 300], "gemm_done_ms": 2.0 + s, "ready_ms": [0.5, 1.5],
             "comm_done_ms": [1.0 + s, 2.5 + s], "comm_ms": [0.5, 1.0],
             "copy_done_ms": [1.25 + s, 3.0 + s]} for s in (0.0, 1.0)]
    recs.append(dict(recs[0], copy_done_ms=None))
    m = trace.medians(recs)
    assert m["copy_done_ms"] == pytest.approx([1.75, 3.5])
    lines = trace.medians_table(m).splitlines()
    assert [line.split()[:2] for line in lines[1:3]] == [["0", "100"], ["1", "200"]]
    assert m["end_ms"] == pytest.approx(3.0) and m["gemm_done_ms"] == pytest.approx(2.0)
    assert "exposed tail   1.000 ms" in lines[-1]
