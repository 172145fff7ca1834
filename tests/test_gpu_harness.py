"""The overlapped ops without JAX (tests/cuda/overlap_harness.cc) on every GPU, one process
each: the framework-free sequences the FFI handlers run, checked element by element against a
float32 host reference (fresh random inputs, poisoned outputs). Builds the harness from the
extension's objects (build/obj), or takes the programs HARNESS_BIN names. The peer-store calls
run on one GPU too, the rank its own peer (EnsurePeerStoresLoopback)."""
import os
import pathlib
import subprocess
import time

import pytest

from test_gpu import requires_gpu, requires_multigpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [requires_gpu]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    # HARNESS_BIN (as tests/cuda/run_overlap_harness.sh reads it): programs built elsewhere, the
    # others beside it (e.g. with another CUDA toolkit than this machine's); else built here.
    prebuilt = os.environ.get("HARNESS_BIN")
    if prebuilt:
        assert os.access(prebuilt, os.X_OK), f"HARNESS_BIN={prebuilt} is not an executable"
        return pathlib.Path(prebuilt).resolve()
    build = tmp_path_factory.mktemp("harness")
    r = subprocess.run(["bash", "tests/cuda/build_overlap_harness.sh", str(build)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return build / "overlap_harness"


def run_harness(harness, logdir, *args, world=None, timeout=300):
    env = dict(os.environ, HARNESS_BIN=str(harness), HARNESS_TIMEOUT=str(timeout))
    if world is not None:
        env["WORLD"] = str(world)
    r = subprocess.run(["bash", "tests/cuda/run_overlap_harness.sh", "none", str(logdir), *args],
                       cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    return r.returncode, r.stdout + r.stderr


def ok_lines(out):
    return [line for line in out.splitlines() if line.endswith(" OK")]


@pytest.mark.multigpu
@requires_multigpu
@pytest.mark.parametrize("shape", [[], ["--m", "320", "--n", "272", "--k", "200"]],
                         ids=["aligned", "unaligned"])
def test_harness_every_op_matches(harness, tmp_path, shape):
    ops = "ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g"
    rc, out = run_harness(harness, tmp_path, "--calls", "2", "--ops", ops, *shape)
    assert rc == 0, out[-6000:]
    world = out.count("): exit 0")
    assert world >= 2 and len(ok_lines(out)) == world * len(ops.split(",")), out[-6000:]


@pytest.mark.gpu
@pytest.mark.parametrize("args", [
    ["--calls", "4"],
    ["--m", "320", "--n", "272", "--k", "200"],
    ["--m", "4096", "--n", "1024", "--k", "256"],  # several waves of tiles per band
    ["--watchdog", "30", "--calls", "3"],           # spin waits reading the abort flag
    ["--stage-mirrors", "1", "--calls", "3"],       # the all-reduce staged in one process
], ids=["aligned", "unaligned", "waves", "watchdog", "staged"])
def test_harness_peer_loopback_matches(harness, tmp_path, args):
    """Both peer-store ops, one rank its own peer: block 0 of every call right, an
    all-reduce's block 1 still the poison (nothing but the peer may write it); staged (as a
    group in one process whose XLA results the others may not write), block 1 the copy of our
    own mirror out of the staging area, equal to block 0."""
    rc, out = run_harness(harness, tmp_path, "--ops", "pr_rs,pr_ar", *args, world=1)
    assert rc == 0, out[-6000:]
    lines = ok_lines(out)
    assert [line.split()[2] for line in lines] == ["pr_rs", "pr_ar"], out[-6000:]


@pytest.mark.gpu
def test_harness_peer_stores_grow_between_calls(harness, tmp_path):
    """A second thread grows the peer-store buffers (and the workspaces) while calls run:
    every call still right, the buffers grown, the calls counted across the growths."""
    rc, out = run_harness(harness, tmp_path, "--ops", "pr_rs,pr_ar,ar", "--calls", "8",
                          "--grow", "6", world=1)
    assert rc == 0, out[-6000:]
    grow = [line for line in out.splitlines() if " grow: " in line]
    assert len(grow) == 1 and grow[0].endswith(" OK") and "peer stores" in grow[0], out[-6000:]


@pytest.mark.gpu
@pytest.mark.parametrize("kind,op", [("cuda", "pr_rs"), ("nccl", "pr_ar")])
def test_harness_failed_peer_call_breaks_the_pair(harness, tmp_path, kind, op):
    """An injected failure is named (its break of the pair, looped back here, enqueued without
    error), and the next call is refused saying to restart."""
    rc, out = run_harness(harness, tmp_path, "--inject", kind, "--ops", op, world=1)
    assert rc == 0, out[-6000:]
    assert f"injected {kind} fault: harness_peer_" in out, out[-6000:]
    assert "letting the pair's calls end failed" not in out, out[-6000:]  # the break enqueued
    refused = [line for line in out.splitlines() if " next call: " in line]
    assert len(refused) == 1 and refused[0].endswith(" OK"), out[-6000:]
    assert "restart the process" in refused[0], out[-6000:]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["pr_rs", "pr_ar"])
def test_harness_failed_peer_store_growth_is_refused_then_regrown(harness, tmp_path, op):
    """A growth of the peer-store buffers that fails (32 TiB) drops the buffer; the next call
    is refused as not connected without breaking the pair (before, it ran on and broke it,
    refusing every later call), and a growth of the right size connects it again: the calls
    after it right."""
    rc, out = run_harness(harness, tmp_path, "--inject", "grow", "--ops", op, world=1)
    assert rc == 0, out[-6000:]
    failed = [line for line in out.splitlines() if " failed growth: " in line]
    assert len(failed) == 1 and failed[0].endswith(" OK"), out[-6000:]
    assert "cudaMalloc" in failed[0] and "not connected" in failed[0], out[-6000:]
    calls = [line for line in ok_lines(out) if " mismatches 0 " in line]
    assert len(calls) == 1 and calls[0].split()[2] == op, out[-6000:]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["pr_rs", "pr_ar"])
def test_harness_watchdog_ends_a_peer_that_never_comes(harness, tmp_path, op):
    """A peer-store call whose peer never comes (an injected wait that no rank ends): the
    watchdog reports it after its seconds, naming the op, and its abort ends the call (the
    waits trap, the stream fails, the process must restart). Until the call's end was ordered
    after its whole sequence, the watchdog saw every peer-store call end at its start and such
    a wait went on for ever (here: the harness's 90 s limit)."""
    rc, out = run_harness(harness, tmp_path, "--inject", "hang", "--ops", op, "--watchdog", "3",
                          world=1, timeout=90)
    assert rc == 0, out[-6000:]
    assert "jax_flashoverlap watchdog: harness_peer_" in out, out[-6000:]
    assert "has not finished after" in out, out[-6000:]
    hang = [line for line in out.splitlines() if " hang: " in line]
    assert len(hang) == 1 and hang[0].endswith(" OK") and "failed after" in hang[0], out[-6000:]


@pytest.mark.gpu
def test_harness_watchdog_aborts_only_with_the_call_mutex(harness, tmp_path):
    """ncclCommAbort frees the communicator, so the watchdog aborts only holding its call
    mutex: a handler blocked while holding it (its launch behind a queue of hung work, or in
    NCCL's enqueue) would otherwise go on into NCCL with a freed communicator. It once went
    ahead after 1 s. Here the harness holds the mutex for 5 s while a call hangs (watchdog
    2 s): no abort until it lets go, then at once; the hung call still fails (the flag, raised
    first, traps its wait)."""
    rc, out = run_harness(harness, tmp_path, "--inject", "hang", "--ops", "pr_rs", "--watchdog",
                          "2", "--hold-mutex", "5", world=1, timeout=90)
    assert rc == 0, out[-6000:]
    hold = [line for line in out.splitlines() if " hold: " in line]
    assert len(hold) == 1 and hold[0].endswith(" OK"), out[-6000:]
    assert "held 5.0 s: no; after: yes" in hold[0], hold[0]
    hang = [line for line in out.splitlines() if " hang: " in line]
    assert len(hang) == 1 and hang[0].endswith(" OK") and "failed after" in hang[0], out[-6000:]


@pytest.mark.gpu
def test_peer_access_tells_the_allocations_apart(harness):
    """Which memory another GPU may write (xla_ffi/comm/peer_access.h; the peer-store
    all-reduce mirrors into the others' results only where it may), asked of the driver on one
    GPU about its own memory: cudaMalloc (legacy) and cudaMallocAsync (pool) writable; virtual
    memory mappings by their access list (read-write yes; read-only or none no); a host
    pointer an error; the per-call check refuses the read-only mapping and remembers an
    allocation once."""
    r = subprocess.run([str(harness.parent / "peer_access_test")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "ALL PASS" in r.stdout, r.stdout + r.stderr


@pytest.mark.gpu
def test_setup_agreement_gives_up_on_a_rank_that_never_comes(harness):
    """Every rank says whether its setup step went through (xla_ffi/comm/agreement.h) before
    a communicator is kept or a workspace registered; a rank whose step failed before the
    agreement never joins, and the others used to wait for it for ever. On one GPU the missing
    rank is a wait queued ahead of the agreement that ends only on an abort: it must give up
    after its bound (1 s here), not later, name why and leave the communicator aborted, and
    destroying it must end. Also: a healthy group agrees, a failed rank's no is heard; the
    point-to-point handshake (ConnectPeers, same bounded group) connects, and gives up the same
    way on a peer that never comes."""
    r = subprocess.run([str(harness.parent / "agreement_test")], capture_output=True, text=True,
                       timeout=150)
    assert r.returncode == 0 and "ALL PASS" in r.stdout, r.stdout + r.stderr


@pytest.mark.gpu
def test_setup_agreement_exits_when_the_abort_never_ends(harness):
    """ncclCommAbort can wait for ever (for a kernel of NCCL's waiting on a peer that never
    comes, as on 2 x H200 with NCCL 2.28, or for work queued before it): the agreement that gave
    up must then end the process with status 134 and a message within the abort's grace
    (AbortMembersOrExit), not hang. On one GPU the abort waits for a queued wait nobody
    releases (exit 3 would mean the abort returned: then NCCL no longer waits for queued work
    and this test must find another way to hold it)."""
    t0 = time.monotonic()
    r = subprocess.run([str(harness.parent / "agreement_test"), "--abort-never-ends"],
                       capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 134, (r.returncode, r.stdout + r.stderr)
    assert "did not join the setup agreement within 1 s" in r.stderr, r.stderr
    assert "did not end within 2 s" in r.stderr and "status 134" in r.stderr, r.stderr
    assert took < 30, took  # 1 s bound + 2 s grace + process start and NCCL init
