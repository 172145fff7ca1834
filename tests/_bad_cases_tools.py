"""Bad-input cases: tuned-config files, the CLIs, several processes, the GPU / extension checks
and environment switches (rows of tests/test_bad_inputs.py)."""
from __future__ import annotations

from jax_flashoverlap import _compat, _ext  # noqa: F401
from _bad_cases_common import *  # noqa: F401,F403  (the table's shared helpers)
from _tuning_util import entry as _entry

# ----------------------------------------------------------------------------- tuned configs


def _config(t, body=None, *, raw=None, name="plans.json", **top):
    """Writes a config file (a dict built from the defaults, or `raw` text or bytes) and
    loads it."""
    path = t.tmp_path / name
    if raw is None:
        data = dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry()])
        data.update(top)
        if body is not None:
            data["entries"] = body
        raw = json.dumps(data)
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    else:
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


def cfg_unknown_key(t):
    # the tuner found XLA faster; misspelled, the entry used to overlap anyway
    _config(t, [_entry(overlapp=False)])


def cfg_unknown_key_cta_policy(t):
    _config(t, [_entry(cta_polcy="zero")])


def cfg_other_collectives_key(t):
    # all-gather keys in an all-reduce entry (was accepted and ignored)
    _config(t, [_entry(chunks=4, gather="collective")])


def cfg_measured_ms_huge(t):
    # valid JSON, but no float: it passed and crashed choose_plan with OverflowError
    _config(t, [_entry(measured_ms=10 ** 400)])


def cfg_not_utf8(t):
    _config(t, raw=b"\xff\xfe{\x00}\x00")


def cfg_duplicate_key(t):
    # json.loads keeps the last value: this entry overlapped though the tuner found XLA faster
    text = json.dumps(dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry()]))
    _config(t, raw=text.replace('"comm_sms": 16', '"overlap": false, "comm_sms": 16, '
                                '"overlap": true'))


def cfg_missing_file(t):
    tuning.load_file(t.tmp_path / "missing.json")


def cfg_bad_file_at_lowering(t):
    """A broken file in the user config dir fails the plan choice (i.e. the lowering)."""
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(t.tmp_path))
    (t.tmp_path / "plans.json").write_text(json.dumps(
        dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry(comm_sms=500)])))
    plan_lib.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)


def cfg_broken_symlink(t):
    """A dangling *.json link in the user config dir (was a bare FileNotFoundError)."""
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(t.tmp_path))
    (t.tmp_path / "plans.json").symlink_to(t.tmp_path / "gone.json")
    _tuned_lookup()


def cfg_nested_too_deep(t):
    # json recursed past Python's limit: a RecursionError naming no file, and
    # `python -m jax_flashoverlap.info` died of it
    _config(t, raw="[" * 100000 + "]" * 100000)


def cfg_integer_too_long(t):
    # int() refuses a number of more than 4300 digits: a ValueError naming no file
    text = json.dumps(dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=[_entry()]))
    _config(t, raw=text.replace('"comm_sms": 16', '"measured_ms": ' + "9" * 5000
                                + ', "comm_sms": 16'))


def cfg_fifo(t):
    """A FIFO named *.json in the config dir: reading it blocked every lookup (and `info`)."""
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(t.tmp_path))
    os.mkfifo(t.tmp_path / "plans.json")
    _tuned_lookup()


def _tuned_lookup():
    tuning._cache.clear()
    return tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)


def env_config_dir_missing(t):
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(t.tmp_path / "tunde"))  # a typo
    _tuned_lookup()


def env_config_dir_a_file(t):
    path = t.tmp_path / "plans.json"
    path.write_text(json.dumps(dict(schema=tuning.SCHEMA, gpu=H200, world_size=2,
                                    entries=[_entry()])))
    t.monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(path))
    _tuned_lookup()


def env_tuned_typo(t):
    t.monkeypatch.setenv(tuning.TUNED_ENV, "fasle")
    _tuned_lookup()


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


def bench_cli(*args):
    """A case: `python -m jax_flashoverlap.bench ARGS` (one CPU device)."""
    return lambda t: run_cli("jax_flashoverlap.bench", *args)


cli_bench_samples_0 = bench_cli("gemm", "--shapes", "64x64x64", "--samples", "0")
cli_bench_calls_0 = bench_cli("gemm", "--shapes", "64x64x64", "--calls", "0")
cli_bench_gemm_world_0 = bench_cli("gemm", "--shapes", "64x64x64", "--world", "0")
cli_bench_gemm_comm_sms_200 = bench_cli("gemm", "--shapes", "64x64x64", "--comm-sms", "200")
cli_bench_gemm_k_not_multiple_of_8 = bench_cli("gemm", "--shapes", "64x64x60")
cli_bench_overlap_world_negative = bench_cli("overlap", "--shapes", "64x64x64", "--world", "-1")
cli_bench_overlap_world_too_large = bench_cli("overlap", "--shapes", "64x64x64", "--world", "2")
cli_bench_a2a_k_not_multiple_of_8 = bench_cli("a2a", "--shapes", "64x64x60")
cli_bench_sweep_without_gpu = bench_cli("sweep", "--shapes", "64x64x64")
cli_bench_overlap_unknown_variant = bench_cli("overlap", "--shapes", "64x64x64", "--variants",
                                              "two-chunk")


def cli_bench_out_a_directory(t):
    # was written only after the first row was measured: IsADirectoryError, a traceback
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "64x64x64", "--samples", "1",
                   "--calls", "1", "--comm-sms", "0", "--out", str(t.tmp_path))


def cli_bench_out_under_a_file(t):
    (t.tmp_path / "a_file").write_text("")
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "64x64x64", "--out",
                   str(t.tmp_path / "a_file" / "run" / "out.json"))


def cli_bench_plot_a_directory(t):
    # --plot was drawn after every row was measured, before the final --out: a traceback
    # there (IsADirectoryError) left --out "complete": false. (A directory named without a
    # suffix got `<dir>.png` from matplotlib; refused now too.)
    (t.tmp_path / "plots.png").mkdir()
    return run_cli("jax_flashoverlap.bench", "overlap", "--shapes", "64x64x64", "--samples", "1",
                   "--calls", "1", "--plot", str(t.tmp_path / "plots.png"))


# A typo's extra field read as 64x64x64 (empty fields were dropped).
cli_bench_shapes_empty_field = bench_cli("gemm", "--shapes", "64xx64x64")
# `--out "$UNSET"`: read as no --out, exit 0 with nothing written.
cli_bench_out_empty = bench_cli("gemm", "--shapes", "64x64x64", "--out", "")


def cli_bench_out_and_plot_one_file(t):
    # the plot was drawn, then the JSON written over it: exit 0, no plot
    same = str(t.tmp_path / "same.png")
    return run_cli("jax_flashoverlap.bench", "overlap", "--shapes", "64x64x64", "--out", same,
                   "--plot", same)


def cli_bench_bad_switch(t):
    # a traceback from the first lowering (rc 1), after the output paths were made
    t.monkeypatch.setenv("JAX_FLASHOVERLAP_TRANSPORT", "pear")
    return run_cli("jax_flashoverlap.bench", "gemm", "--shapes", "64x64x64")


def cli_tune_out_empty(t):
    # `--out "$UNSET"` merged into the user config dir that every later process reads
    return run_cli("jax_flashoverlap.tune", "--out", "")


def cli_tune_without_gpu(t):
    return run_cli("jax_flashoverlap.tune", "--shapes", "256x256x256")


def cli_tune_max_error(value):
    # checked before the GPU check (so on CPU too); nan turned the value check off
    return lambda t: run_cli("jax_flashoverlap.tune", "--max-error", value)


def cli_launch_n0(t):
    script = t.tmp_path / "ok.py"
    script.write_text("print('never started')\n")
    return run_cli("jax_flashoverlap.launch", "-n", "0", str(script))


def cli_launch_n_huge(t):
    script = t.tmp_path / "ok.py"
    script.write_text("print('never started')\n")
    return run_cli("jax_flashoverlap.launch", "-n", "100000", str(script))


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


def dist_shared_value_never_arrives(t):
    # a group's NCCL id, made by the process of its rank 0 (process 1 here), never comes
    _fake_two_processes(t)
    t.monkeypatch.setenv(distributed.TIMEOUT_ENV, "2")
    distributed.share("uid/7/1/0", owner_process=1, make=lambda: "")


def dist_bad_timeout_env(t):
    _fake_two_processes(t)
    t.monkeypatch.setenv(distributed.TIMEOUT_ENV, "five minutes")
    distributed.barrier("init/1")


def dist_kv_timeout_too_large(t):
    # 3e9 ms is past the store's int: a TypeError from it, reported as a timeout of 3e6 s
    _fake_two_processes(t)
    t.monkeypatch.setenv(distributed.TIMEOUT_ENV, "3000000")
    distributed.barrier("init/1")


class _StoreRefusingArgs(_FakeKV):
    def blocking_key_value_get(self, key, timeout_ms):
        raise TypeError("blocking_key_value_get(): incompatible function arguments")


def dist_store_type_error(t):
    """A TypeError of the store (its binding refused the arguments) is raised as it is, not
    as a wait that timed out."""
    _fake_two_processes(t)
    t.monkeypatch.setattr(_compat, "distributed_client", lambda: _StoreRefusingArgs())
    distributed.share("uid/7/1/0", owner_process=1, make=lambda: "")


def dist_bad_num_processes_env(t):
    t.monkeypatch.setenv(distributed.COORDINATOR_ENV, "127.0.0.1:1")
    t.monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "two")
    distributed.initialize()


def _launcher_env(t, **values):
    """distributed.initialize() with exactly these launcher variables set."""
    names = dict(coordinator=distributed.COORDINATOR_ENV, num=distributed.NUM_PROCESSES_ENV,
                 pid=distributed.PROCESS_ID_ENV)
    for key, name in names.items():
        if key in values:
            t.monkeypatch.setenv(name, values[key])
        else:
            t.monkeypatch.delenv(name, raising=False)
    distributed.initialize()


def dist_launcher_env_partly_set(t):
    _launcher_env(t, num="2", pid="1")  # ran alone before, as if one process


def dist_num_processes_negative(t):
    _launcher_env(t, coordinator="127.0.0.1:1", num="-2", pid="0")  # was a silent no-op


def dist_process_id_out_of_range(t):
    _launcher_env(t, coordinator="127.0.0.1:1", num="2", pid="2")


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


def env_fallback_typo_overlapped(t):
    # overlap pays at this shape and comm_sms is given: the switch is never consulted there
    t.monkeypatch.delenv(_ext.FORCE_REFERENCE_ENV, raising=False)
    t.monkeypatch.setenv(_ext.FALLBACK_ENV, "of")
    cuda_lowering_text(x=(8192, 16384), w=(16384, 8192), comm_sms=16)


def lowering_with_env(name, value):
    """A case: lower an op for CUDA with environment variable `name` set to `value`."""
    def case(t):
        t.monkeypatch.delenv(_ext.FORCE_REFERENCE_ENV, raising=False)
        t.monkeypatch.setenv(name, value)
        cuda_lowering_text()
    return case


env_all_reduce_buffer_typo = lowering_with_env(_ext.ALL_REDUCE_BUFFER_ENV, "in_place")
env_gemm_epilogue_typo = lowering_with_env(_ext.GEMM_EPILOGUE_ENV, "snyc")
env_gemm_queue_typo = lowering_with_env(_ext.GEMM_QUEUE_ENV, "dynamc")
env_gemm_tail_typo = lowering_with_env(_ext.GEMM_TAIL_ENV, "spilt")
env_gemm_schedule_typo = lowering_with_env(_ext.GEMM_SCHEDULE_ENV, "ping-pong")
env_gemm_helpers_word = lowering_with_env(_ext.GEMM_HELPERS_ENV, "1")  # the calls read 'on' only
env_poison_outputs_typo = lowering_with_env(_ext.POISON_OUTPUTS_ENV, "nan")
env_gemm_serpentine_word = lowering_with_env("FLASHOVERLAP_GEMM_SERPENTINE", "true")  # atoi: 0
env_gemm_panel_zero = lowering_with_env("FLASHOVERLAP_GEMM_PANEL", "0")  # was clamped to 1
# an Arabic-Indic digit one: re's \d and int() took it as 1 at lowering; the launcher refuses
# it at every launch (a failed call on the GPU instead of an error at lowering)
env_gemm_serpentine_non_ascii_digit = lowering_with_env("FLASHOVERLAP_GEMM_SERPENTINE", "\u0661")
env_gemm_tile_other = lowering_with_env("FLASHOVERLAP_GEMM_TILE", "64")  # was ignored
env_wait_typo = lowering_with_env(_ext.WAIT_ENV, "spinn")  # was the stream-op default
env_transport_typo = lowering_with_env(_ext.TRANSPORT_ENV, "nvlink")


# ----------------------------------------------------------------------------- the table


# ----------------------------------------------------------------------------- plan overrides

def plan_forced_overlap_not_bool(t):
    # a truthy string: choose_plan's plan had overlap='false', and the op overlapped
    with plan_lib.forced(overlap="false"):
        pass


def plan_forced_a2a_overlap_not_bool(t):
    from jax_flashoverlap import plan_a2a
    with plan_a2a.forced(overlap="no"):
        pass


def plan_forced_band_rows_not_ints(t):
    # int(b) made the band boundary 10.7 row 10, silently
    with plan_lib.forced(band_rows=(0, 10.7, 64)):
        pass


def plan_forced_all_gather_comm_sms_0(t):
    # check_forced takes 0 (the all-to-all's NCCL keeps its own CTAs); the all-gather's plan
    # read it as 1 without a word
    from jax_flashoverlap import plan_a2a
    with plan_a2a.forced(comm_sms=0):
        plan_a2a.choose_all_gather_plan(4096, 8192, 4096, 2)
