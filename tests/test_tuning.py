"""Plans: the cost model, forced overrides, tuned-config files (validation, lookup, merge) and
the kernel build an entry records (the tuner CLI: tests/test_tune_cli.py)."""
import json
import os
import re
import subprocess
import sys

import pytest

from jax_flashoverlap import plan as P
from jax_flashoverlap import tile_schedule as ts
from jax_flashoverlap import tuning, tune

from _tuning_util import H200, entry as _entry, write_config as _write


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("shape", [(4096, 8192, 4096), (8192, 8192, 4096), (8192, 28672, 4096)])
def test_cost_model_plan_is_valid_and_deterministic(collective, shape):
    m, n, k = shape
    a = P.default_plan(collective, m, n, k, 2)
    b = P.default_plan(collective, m, n, k, 2)
    assert a == b
    a.validate()
    limit = P.calibrated_ctas(collective, P.DEFAULT_PROFILE)
    assert a.comm_sms in {s for c in P.DEFAULT_PROFILE.comm_sms_candidates
                          for s in (c, ts.wave_aligned_comm_sms(m, n, c, max(c, limit)))}
    rows = m // (2 if collective == "reduce_scatter" else 1)
    assert a.band_rows[0] == 0 and a.band_rows[-1] == rows
    assert a.predicted_s > 0 and a.baseline_s > 0


def test_world_size_picks_its_measured_calibration():
    """2 ranks: the 2 x H200 fit; 4 and 8 ranks: the 4 x H200 fit (the largest measured <= world).
    With it, the 4-GPU reduce-scatter that lost to XLA (4096 x 8192 x 2048 per GPU, 0.89x in
    benchmarks/results/h200x4.json) now falls back, and the shapes that gained still overlap."""
    assert P.profile_for_world(1) is P.DEFAULT_PROFILE
    assert P.profile_for_world(2) is P.DEFAULT_PROFILE
    assert P.profile_for_world(4) is P.WORLD4_PROFILE
    assert P.profile_for_world(8) is P.WORLD4_PROFILE
    assert not P.choose_plan("reduce_scatter", 4096, 8192, 2048, 4).overlap
    assert P.choose_plan("all_reduce", 8192, 8192, 7168, 4).overlap          # 1.19x measured
    assert P.choose_plan("reduce_scatter", 8192, 8192, 7168, 4).overlap      # 1.13x measured
    # the comm_sms argument keeps the world's calibration
    assert P.choose_plan("all_reduce", 8192, 8192, 2048, 4, comm_sms=8).baseline_s == \
        P.baseline_time("all_reduce", 8192, 8192, 2048, 4, 2, P.WORLD4_PROFILE)


def test_cost_model_falls_back_on_tiny_problems():
    plan = P.default_plan("all_reduce", 8, 64, 64, 2)
    assert not plan.overlap and plan.num_groups == 1


def test_forced_override_and_explicit_comm_sms():
    with P.forced(num_groups=4, comm_sms=8):
        plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    assert plan.comm_sms == 8 and plan.num_groups == 4 and plan.overlap
    assert all(b % 256 == 0 for b in plan.band_rows)  # the kernel's cluster rows
    with P.forced(overlap=False):
        assert not P.choose_plan("all_reduce", 8192, 8192, 4096, 2).overlap
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2, comm_sms=8).comm_sms == 8


def test_forced_cta_policy_reaches_the_plan():
    """forced(cta_policy=...) sets the communicator's CTA policy of the plans lowered inside
    (tuning's CTA-policy round times each policy through it); outside, the plan's own."""
    with P.forced(cta_policy="zero"):
        plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    assert plan.cta_policy == "zero" and plan.source == "forced"
    with P.forced(num_groups=2, cta_policy="efficiency"):
        assert P.choose_plan("reduce_scatter", 8192, 8192, 4096, 2).cta_policy == "efficiency"
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2).cta_policy == "default"


def test_in_place_does_not_skip_a_reduce_scatters_tuned_plan(user_dir):
    """in_place is the all-reduce's (on XLA's output, which tuned plans were not measured
    with); a reduce-scatter asked with it still takes its tuned entry."""
    _write(user_dir / "rs.json", [_entry(collective="reduce_scatter", band_rows=[0, 256, 512],
                                         comm_sms=12)])
    plan = P.choose_plan("reduce_scatter", 1024, 512, 256, 2, gpu=H200, in_place=True)
    assert plan.source == "tuned" and plan.band_rows == (0, 256, 512) and plan.comm_sms == 12


def test_shipped_h200_config_is_valid_and_used(user_dir):
    shipped = sorted(tuning.PACKAGE_DIR.glob("*.json"))
    assert shipped, "no package-shipped config"
    for f in shipped:
        assert tuning.load_file(f)
    entry = tuning.lookup(H200, 2, "all_reduce", "bfloat16", 8192, 8192, 4096)
    assert entry is not None and entry["measured_ms"] < entry["baseline_ms"]
    plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2, gpu=H200)
    assert list(plan.band_rows) == entry["band_rows"] and plan.comm_sms == entry["comm_sms"]
    # another GPU, or an explicit comm_sms, goes to the cost model
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2, gpu="NVIDIA H100") == \
        P.default_plan("all_reduce", 8192, 8192, 4096, 2)
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2, comm_sms=8, gpu=H200).comm_sms == 8


def test_user_config_overrides_and_is_used(user_dir):
    _write(user_dir / "mine.json", [_entry(band_rows=[0, 256, 1024], comm_sms=12)])
    plan = P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
    assert plan.band_rows == (0, 256, 1024) and plan.comm_sms == 12


BAD = {
    "not_json": "{not json",
    "no_schema": json.dumps({"gpu": H200, "world_size": 2, "entries": []}),
    "bad_world": json.dumps({"schema": tuning.SCHEMA, "gpu": H200, "world_size": "2",
                             "entries": []}),
    "bands_not_ending_at_rows": [_entry(band_rows=[0, 512, 1000])],
    "bands_not_increasing": [_entry(band_rows=[0, 512, 512, 1024])],
    "too_many_groups": [_entry(band_rows=list(range(0, 1025, 8)))],
    # 65 groups, one over the kernel's kMaxGroups counters (a bound off by one let it load).
    "one_group_over_the_cap": [_entry(band_rows=list(range(0, 513, 8)) + [1024])],
    "comm_sms_out_of_range": [_entry(comm_sms=200)],
    "bad_collective": [_entry(collective="all_sum")],
    "bad_dtype": [_entry(dtype="float32")],
    "rs_rows_not_divisible": [_entry(collective="reduce_scatter", m=1023, band_rows=[0, 511])],
    "duplicate": [_entry(), _entry()],
    "overlap_not_bool": [_entry(overlap="yes")],
    "overlap_misspelled": [_entry(overlapp=False)],
    "cta_policy_misspelled": [_entry(cta_polcy="zero")],
    "measured_ms_overflows_a_float": [_entry(measured_ms=10 ** 400)],
    "baseline_ms_infinite": [_entry(baseline_ms=float("inf"))],
    "cta_policy_ms_negative": [_entry(cta_policy_ms={"default": 1.0, "zero": -1.0})],
    "not_utf8": b"\xff\xfe{\x00}\x00",
    "transport_misspelled": [_entry(transport="nvlink")],
    "transport_peer_bands_over_m": [_entry(transport="peer", comm_sms=0)],  # must end at m / 2
    "transport_peer_with_comm_sms": [_entry(transport="peer", band_rows=[0, 512])],
    # A misspelt top-level key was ignored (so its value, e.g. the world size, was not used).
    "top_level_key_misspelt": json.dumps({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 2,
                                          "wrold_size": 4, "entries": []}),
    # world_size 0 loaded (a reduce-scatter entry then divided by zero, naming no file).
    "world_size_zero": json.dumps({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 0,
                                   "entries": []}),
    "gpu_blank": json.dumps({"schema": tuning.SCHEMA, "gpu": "  ", "world_size": 2,
                             "entries": []}),
    "note_not_text": json.dumps({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 2,
                                 "note": 3, "entries": []}),
    "cta_policy_ms_unknown_policy": [_entry(cta_policy_ms={"default": 1.0, "bogus": 1.0})],
    # An overlapped all-gather with comm_sms 0 was read as 1 without a word.
    "all_gather_overlapped_with_no_sms": [{"collective": "all_gather", "dtype": "bfloat16",
                                           "m": 512, "n": 512, "k": 256, "comm_sms": 0,
                                           "chunks": 1, "gather": "p2p", "overlap": True}],
    # At world size 4 a peer entry's bands cover m / 4 = 256 rows, not 512.
    "transport_peer_world_4_bands_over_a_block": json.dumps({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 4,
                                          "entries": [_entry(transport="peer", comm_sms=0,
                                                             band_rows=[0, 512])]}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_file_is_an_error_naming_the_file(user_dir, case):
    path = user_dir / f"{case}.json"
    body = BAD[case]
    if isinstance(body, bytes):
        path.write_bytes(body)
    elif isinstance(body, str):
        path.write_text(body)
    else:
        _write(path, body)
    with pytest.raises(tuning.ConfigError, match=case):
        tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)


def test_an_entry_of_exactly_max_groups_loads(user_dir):
    """64 groups (kMaxGroups) is the largest plan: it loads, one more does not (BAD)."""
    bands = list(range(0, 505, 8)) + [1024]
    assert len(bands) - 1 == P.MAX_GROUPS
    _write(user_dir / "cap.json", [_entry(band_rows=bands)])
    plan = P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
    assert plan.num_groups == P.MAX_GROUPS and plan.source == "tuned"


def test_all_gather_entry_of_xla_composition_may_have_no_sms(user_dir):
    """What tune --ops writes where XLA's composition won (overlap false, comm_sms 0) loads."""
    _write(user_dir / "ag.json", [{"collective": "all_gather", "dtype": "bfloat16", "m": 512,
                                   "n": 512, "k": 256, "comm_sms": 0, "chunks": 1,
                                   "gather": "p2p", "overlap": False}])
    entry = tuning.lookup(H200, 2, "all_gather", "bfloat16", 512, 512, 256)
    assert entry is not None and entry["overlap"] is False


def test_every_key_the_tuner_writes_is_allowed():
    """Unknown entry keys are errors (typos): the allow-list must hold every key tune.py and
    tune_a2a.py write, or their own entries would be refused."""
    from jax_flashoverlap import plan_a2a, tune_a2a
    from jax_flashoverlap.tune_model import Candidate
    ours = tune.entry_for("all_reduce", "bfloat16", 8192, 8192, 4096, 2,
                          Candidate(16, (0, 4096, 8192), 1e-3, "dp"), 1.05, 1.2)
    ours.update(cta_policy="zero", cta_policy_ms={"default": 1.1, "zero": 1.05})  # tune_problem
    ours.update(kernel="0123abcd")  # main's save: the kernel build it was measured on
    xla = tune.entry_for("reduce_scatter", "bfloat16", 8192, 8192, 4096, 2, None, 0.0, 1.2)
    gather = tune_a2a.entry_for("all_gather", "bfloat16", 4096, 4096, 8192, 2,
                                plan_a2a.choose_all_gather_plan(4096, 4096, 8192, 2), 1.0, 1.2)
    a2a = tune_a2a.entry_for("all_to_all", "bfloat16", 4096, 8192, 4096, 2,
                             plan_a2a.choose_a2a_plan(4096, 8192, 4096, 2, 0, 0), 1.0, 1.2)
    peer = tune.entry_for("reduce_scatter", "bfloat16", 8192, 8192, 8192, 2,
                          Candidate(0, (0, 2048, 4096), 1e-3, "peer"), 1.0, 1.2, transport="peer")
    entries = [ours, xla, gather, a2a, peer]
    assert set().union(*entries) == tuning.ENTRY_KEYS
    for e in entries:  # and each only its own collective's
        assert set(e) <= tuning.COLLECTIVE_KEYS[e["collective"]], e
    assert set(ours) | set(xla) | set(peer) == tuning.COLLECTIVE_KEYS["all_reduce"]
    assert len(tuning.validate({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 2,
                                "entries": entries})) == 5


def test_tuned_switch_and_config_dir_env(tmp_path, monkeypatch):
    """JAX_FLASHOVERLAP_TUNED is an on/off switch like the others (before, only "0" turned tuned
    entries off: "false" kept them), and JAX_FLASHOVERLAP_CONFIG_DIR expands "~" (a quoted
    "~/tuned" read nothing)."""
    home = tmp_path / "home"
    (home / "tuned").mkdir(parents=True)
    _write(home / "tuned" / "mine.json", [_entry(band_rows=[0, 256, 1024], comm_sms=12)])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, "~/tuned")
    assert tuning.user_config_dir() == home / "tuned"
    lookup = lambda: tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)  # noqa: E731
    assert lookup()["comm_sms"] == 12
    for off in ("0", "false", "off", "no", " No "):
        monkeypatch.setenv(tuning.TUNED_ENV, off)
        assert lookup() is None, off
    for on in ("1", "true", "on", ""):
        monkeypatch.setenv(tuning.TUNED_ENV, on)
        assert lookup()["comm_sms"] == 12, on
    # unset, the default honours XDG_CACHE_HOME (README), else ~/.cache
    monkeypatch.delenv(tuning.CONFIG_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning.user_config_dir() == tmp_path / "xdg" / "jax_flashoverlap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tuning.user_config_dir() == home / ".cache" / "jax_flashoverlap"


def test_write_entries_merges_and_checks_gpu(user_dir):
    path = user_dir / "t.json"
    tuning.write_entries(path, H200, 2, [_entry()])
    tuning.write_entries(path, H200, 2, [_entry(n=1024), _entry(comm_sms=8)])
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 2
    assert {e["comm_sms"] for e in data["entries"] if e["n"] == 512} == {8}
    with pytest.raises(tuning.ConfigError, match="not NVIDIA H100"):
        tuning.write_entries(path, "NVIDIA H100", 2, [_entry()])


_MERGE_SCRIPT = """
import sys
from jax_flashoverlap import tuning
path, first = sys.argv[1], int(sys.argv[2])
for i in range(30):
    tuning.write_entries(path, "NVIDIA H200", 2, [dict(
        collective="all_reduce", dtype="bfloat16", m=1024, n=8 * (first + i), k=256,
        comm_sms=16, band_rows=[0, 512, 1024])])
"""


def test_write_entries_from_several_processes_at_once(tmp_path):
    """Two tuner runs on one machine (GPUs 0-1 and 2-3) merge into the same <gpu>_x2.json: with
    one shared temporary file name and no lock, writers failed (FileNotFoundError: the .tmp
    renamed away by the other), entries were lost (52 of 160 kept) and a reader could see a
    half-written file. Now every entry is kept and nothing but the file and its lock is left."""
    repo = tuning.PACKAGE_DIR.parent.parent
    path = tmp_path / "nvidia_h200_x2.json"
    procs = [subprocess.Popen([sys.executable, "-c", _MERGE_SCRIPT, str(path), str(1 + 1000 * j)],
                              cwd=repo, stderr=subprocess.PIPE, text=True) for j in range(4)]
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert len(tuning.load_file(path)) == 4 * 30
    assert sorted(f.name for f in tmp_path.iterdir()) == [path.name, path.name + ".lock"]


def test_a_rewrite_within_one_clock_tick_is_seen(user_dir):
    """load_all's cache: a config rewritten (as write_entries does, a new file renamed in
    place) with the same mtime, as on a filesystem with a coarse clock, is read again."""
    path = user_dir / "t.json"
    tuning.write_entries(path, H200, 2, [_entry(comm_sms=16)])
    before = path.stat().st_mtime_ns
    assert tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)["comm_sms"] == 16
    tuning.write_entries(path, H200, 2, [_entry(comm_sms=8)])
    os.utime(path, ns=(before, before))  # the same tick as the first write
    assert tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)["comm_sms"] == 8


@pytest.mark.parametrize("entry, world, message", [
    (dict(transport="nvlink"), 2, "'transport' must be 'nccl' or 'peer', got 'nvlink'"),
    (dict(transport="peer", comm_sms=0), 2, "must start at 0 and end at 512"),
    (dict(transport="peer", band_rows=[0, 512]), 2, "every SM (comm_sms 0, got 16)"),
    (dict(transport="peer", comm_sms=0, band_rows=[0, 512]), 4, "must start at 0 and end at 256"),
    (dict(transport="peer", comm_sms=0, band_rows=[0, 32]), 32,
     "transport 'peer' needs world_size 2 to 8, the file is for 32"),
    # The peer launch runs every rank block's bands: 8 blocks x 9 bands = 72 counters > 64,
    # although 9 bands alone are within MAX_GROUPS.
    (dict(transport="peer", comm_sms=0, band_rows=list(range(0, 65, 8)) + [128]), 8,
     "at most 8 bands per block at world size 8 (got 9)"),
])
def test_peer_entries_are_checked(user_dir, entry, world, message):
    _write(user_dir / "peer.json", [_entry(**entry)], world_size=world)
    with pytest.raises(tuning.ConfigError, match=re.escape(message)):
        tuning.lookup(H200, world, "all_reduce", "bfloat16", 1024, 512, 256)


def test_peer_entry_is_taken_only_where_peer_is_allowed(user_dir):
    """A tuned peer-store entry (bands of one block of m / 2 rows, comm_sms 0) is the peer
    path's plan (plan_peer.tuned: the lowering's JAX_FLASHOVERLAP_TRANSPORT=auto); the NCCL
    path's choose_plan skips it for the cost model's NCCL plan."""
    from jax_flashoverlap import plan_peer
    _write(user_dir / "peer.json", [_entry(transport="peer", comm_sms=0, band_rows=[0, 256, 512],
                                           measured_ms=0.5, baseline_ms=0.8),
                                    _entry(collective="reduce_scatter", band_rows=[0, 256, 512])])
    # the reduce-scatter's entry is an NCCL plan: not the peer path's
    assert plan_peer.tuned("reduce_scatter", 1024, 512, 256, H200) is None
    peer = plan_peer.tuned("all_reduce", 1024, 512, 256, H200)
    assert (peer.transport, peer.rows_per_block, peer.band_rows, peer.comm_sms) == (
        "peer", 512, (0, 256, 512), 0)
    nccl = P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
    assert nccl.transport == "nccl" and nccl == P.default_plan("all_reduce", 1024, 512, 256, 2)


def test_peer_entry_of_a_group_of_4(user_dir):
    """At world size 4 a peer entry's bands cover one block of m / 4 rows."""
    from jax_flashoverlap import plan_peer
    _write(user_dir / "peer4.json", [_entry(transport="peer", comm_sms=0, band_rows=[0, 128, 256])],
           world_size=4)
    assert plan_peer.tuned("all_reduce", 1024, 512, 256, H200) is None  # world 2: no entry
    peer = plan_peer.tuned("all_reduce", 1024, 512, 256, H200, world=4)
    assert (peer.transport, peer.rows_per_block, peer.band_rows) == ("peer", 256, (0, 128, 256))


def test_tuner_keeps_the_fastest_of_nccl_plans_peer_and_xla():
    from jax_flashoverlap.tune_model import Candidate
    a, b = Candidate(8, (0, 512, 1024), 1e-3, "dp"), Candidate(16, (0, 1024), 1e-3, "even1")
    peer = Candidate(0, (0, 256, 512), 9e-4, "peer")
    assert tune.fastest({a: 1.0, b: 0.9}, 1.2) is b
    assert tune.fastest({a: 1.0, b: 0.9, peer: 0.8}, 1.2) is peer
    assert tune.fastest({a: 1.0, b: 0.9, peer: 0.95}, 1.2) is b
    assert tune.fastest({a: 1.3, peer: 1.25}, 1.2) is None  # XLA's path was fastest
    e = tune.entry_for("all_reduce", "bfloat16", 1024, 512, 256, 2, peer, 0.8, 1.2, transport="peer")
    assert (e["transport"], e["comm_sms"], e["band_rows"]) == ("peer", 0, [0, 256, 512])
    assert len(tuning.validate({"schema": tuning.SCHEMA, "gpu": H200, "world_size": 2,
                                "entries": [e]})) == 1


# ------------------------------------------------------------------ kernel builds

@pytest.mark.parametrize("bad", [7, "", "XYZ", "ABCDEF", "a" * 65, ["ab"]])
def test_an_entry_kernel_build_must_be_lowercase_hex(bad, user_dir):
    path = _write(user_dir / "k.json", [_entry(kernel=bad)])
    with pytest.raises(tuning.ConfigError, match=r"entries\[0\]: 'kernel' must be the kernel "
                                                 r"build .* k\.json|k\.json.*'kernel' must be"):
        tuning.load_file(path)


def _fresh_warnings(monkeypatch, build):
    from jax_flashoverlap import _ext
    monkeypatch.setattr(_ext, "kernel_build", lambda: build)
    monkeypatch.setattr(tuning, "_warned_builds", set())


@pytest.mark.parametrize("recorded, build, warns", [
    ("0123abcd", "0123abcd", False),   # measured on this build
    ("0123abcd", "fedc9876", True),    # on another one
    (None, "fedc9876", False),         # not recorded: written before builds were, or by hand
    ("0123abcd", None, False),         # no extension: nothing to compare with
])
def test_a_plan_of_another_kernel_build_warns_once_and_is_still_used(
        recorded, build, warns, user_dir, monkeypatch, recwarn):
    """Stale plans are named (the file, both builds, what to do), never dropped: every rank must
    choose from the files alone, whatever each one built."""
    import warnings
    _fresh_warnings(monkeypatch, build)
    kw = {} if recorded is None else dict(kernel=recorded)
    path = _write(user_dir / "h200_x2.json", [_entry(comm_sms=12, **kw)])
    warnings.simplefilter("always")
    for _ in range(3):
        plan = P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
        assert plan.comm_sms == 12 and plan.band_rows == (0, 512, 1024)  # the tuned plan
    stale = [w for w in recwarn.list if issubclass(w.category, tuning.KernelBuildWarning)]
    assert len(stale) == (1 if warns else 0), [str(w.message) for w in recwarn.list]
    if warns:
        text = str(stale[0].message)
        for part in ("all_reduce bfloat16 1024x512x256", str(path), "build 0123abcd",
                     "build fedc9876", "still used", "jax_flashoverlap.tune",
                     "JAX_FLASHOVERLAP_TUNED=0"):
            assert part in text, text


def test_kernel_builds_by_file_counts_each_status(user_dir, monkeypatch):
    _fresh_warnings(monkeypatch, "00aa")
    path = _write(user_dir / "mixed.json", [
        _entry(kernel="00aa"), _entry(m=2048, band_rows=[0, 2048], kernel="00bb"),
        _entry(m=4096, band_rows=[0, 4096])])
    assert tuning.kernel_builds_by_file([path]) == {
        str(path): {"current": 1, "other": 1, "unrecorded": 1}}


def test_a_rewritten_or_other_files_stale_entry_is_named_again(user_dir, monkeypatch, recwarn):
    """Warned once per (problem, file, recorded build): a file rewritten with another stale
    build, or the entry now from another file, warns again (it was once per problem)."""
    import warnings
    _fresh_warnings(monkeypatch, "cccc")
    warnings.simplefilter("always")

    def stale_warnings():
        P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
        P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)
        got = [str(w.message) for w in recwarn.list
               if issubclass(w.category, tuning.KernelBuildWarning)]
        recwarn.clear()
        return got
    a = user_dir / "a.json"
    _write(a, [_entry(kernel="aaaa")])
    assert len(stale_warnings()) == 1
    _write(a, [_entry(kernel="bbbb", comm_sms=20)])
    os.utime(a, ns=(1, 1))  # a changed stamp even within the clock's tick
    got = stale_warnings()
    assert len(got) == 1 and "build bbbb" in got[0], got
    a.unlink()
    _write(user_dir / "z.json", [_entry(kernel="dddd")])
    got = stale_warnings()
    assert len(got) == 1 and "z.json" in got[0] and "build dddd" in got[0], got


def test_a_stale_warning_raised_as_an_error_raises_at_every_lookup(user_dir, monkeypatch):
    """Under -W error the lookup fails every time (it failed once, then silently passed)."""
    import warnings
    _fresh_warnings(monkeypatch, "cccc")
    _write(user_dir / "a.json", [_entry(kernel="aaaa")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(tuning.KernelBuildWarning):
                P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu=H200)


def test_hidden_files_in_the_config_dir_are_not_configs(user_dir):
    """An editor's lock (Emacs' `.#plans.json`, a dangling link while the file is open) or
    macOS's `._plans.json` beside a config broke every lookup: they are not read."""
    _write(user_dir / "plans.json", [_entry(comm_sms=8)])
    (user_dir / ".#plans.json").symlink_to("root@host.4242:1733350000")
    (user_dir / "._plans.json").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00")
    assert [f for f in tuning.config_files() if f.parent == user_dir] == [user_dir / "plans.json"]
    assert tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)["comm_sms"] == 8


def test_the_config_dir_is_checked_at_lowering_only_while_tuned_plans_are_on(tmp_path,
                                                                              monkeypatch):
    """JAX_FLASHOVERLAP_TUNED=0 reads no config (README; `info` says so too), yet a lowering
    still refused a JAX_FLASHOVERLAP_CONFIG_DIR that is not a folder."""
    from _bad_cases_common import cuda_lowering_text
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(tuning.ConfigError, match="must be a directory"):
        cuda_lowering_text()
    monkeypatch.setenv(tuning.TUNED_ENV, "0")
    assert "stablehlo" in cuda_lowering_text()


_A2A = dict(collective="all_to_all", dtype="bfloat16", m=1024, n=512, k=256, comm_sms=16,
            band_rows=[0, 512], split_axis=0, concat_axis=0)
_GATHER = dict(collective="all_gather", dtype="bfloat16", m=512, n=512, k=256, comm_sms=16,
               chunks=1, gather="p2p")


@pytest.mark.parametrize("entry, message", [
    (dict(_A2A, split_axis=2), "'split_axis'=2 outside [0, 1]"),
    (dict(_A2A, m=1025), "m=1025 is not divisible by world_size 2 (split_axis 0)"),
    (dict(_GATHER, chunks=64), "world_size * chunks must be <= 64"),
    (dict(_GATHER, chunks=2, gather="collective"), "chunks must be 1, got 2"),
])
def test_all_to_all_and_all_gather_entries_are_checked(user_dir, entry, message):
    """An all-to-all / all-gather entry the ops could not run (an axis other than 0 / 1, rows
    that do not split over the ranks, more chunk counters than the kernel has, chunks with
    the whole-block collective gather) is an error naming the file, as on every rank."""
    path = _write(user_dir / "a2a.json", [entry])
    with pytest.raises(tuning.ConfigError, match=re.escape(str(path))) as err:
        tuning.lookup(H200, 2, "all_reduce", "bfloat16", 1024, 512, 256)
    assert message in str(err.value)


def test_all_to_all_entries_are_keyed_by_their_axes(user_dir):
    """One shape's all-to-all may be tuned once per (split_axis, concat_axis): both entries
    load, and each variant gets its own plan (not a 'duplicate entry' error, not the other's)."""
    from jax_flashoverlap import plan_a2a
    _write(user_dir / "a2a.json", [_A2A, dict(_A2A, split_axis=1, concat_axis=1, comm_sms=8,
                                                  band_rows=[0, 512, 1024])])
    plan = plan_a2a.choose_a2a_plan(1024, 512, 256, 2, 0, 0, gpu=H200)
    assert plan.band_rows == (0, 512) and plan.comm_sms == 16
    plan = plan_a2a.choose_a2a_plan(1024, 512, 256, 2, 1, 1, gpu=H200)
    assert plan.band_rows == (0, 512, 1024) and plan.comm_sms == 8
    assert tuning.lookup(H200, 2, "all_to_all", "bfloat16", 1024, 512, 256, 1, 0) is None


def test_the_user_config_dir_wins_over_the_shipped_configs(user_dir):
    """The user's entry for a shape the package ships a plan for replaces it (README: the
    user dir's entries win), whatever the files' names."""
    shipped = tuning.lookup(H200, 2, "all_reduce", "bfloat16", 8192, 8192, 4096)
    assert shipped is not None and shipped["comm_sms"] != 12
    _write(user_dir / "a.json", [_entry(m=8192, n=8192, k=4096, comm_sms=12,
                                        band_rows=[0, 4096, 8192])])
    assert tuning.lookup(H200, 2, "all_reduce", "bfloat16", 8192, 8192, 4096)["comm_sms"] == 12
    plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2, gpu=H200)
    assert plan.source == "tuned" and plan.band_rows == (0, 4096, 8192) and plan.comm_sms == 12


def test_write_entries_refuses_a_file_of_another_world_size(user_dir):
    """Plans measured on 4 GPUs merged into a 2-GPU file would be taken at world size 2."""
    path = user_dir / "t.json"
    tuning.write_entries(path, H200, 2, [_entry()])
    with pytest.raises(tuning.ConfigError, match=re.escape(f"{path} holds plans for {H200} x 2, "
                                                           f"not {H200} x 4")):
        tuning.write_entries(path, H200, 4, [_entry(comm_sms=8)])
    assert tuning.load_file(path)[(H200, 2) + tuning.entry_key(_entry())]["comm_sms"] == 16


def test_the_tuner_keeps_xlas_path_on_a_tie():
    """fastest(): XLA's dot + collective is kept where the fastest plan is only as fast (an
    overlapped entry must have beaten it); a hair faster, the plan is kept."""
    from jax_flashoverlap.tune_model import Candidate
    a, b = Candidate(8, (0, 512, 1024), 1e-3, "dp"), Candidate(16, (0, 1024), 1e-3, "even1")
    assert tune.fastest({a: 1.2, b: 1.3}, 1.2) is None
    assert tune.fastest({a: 1.1999, b: 1.3}, 1.2) is a
