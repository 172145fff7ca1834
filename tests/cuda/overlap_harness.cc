// One process of a JAX-free run of the overlapped ops: the same framework-free sequences the
// FFI handlers run (xla_ffi/comm/overlap_calls.h), on communicators made the same way, so
// NVIDIA compute-sanitizer can watch whole overlapped calls (under JAX, racecheck crashed the
// process before any kernel ran: benchmarks/results/README.md).
//
//   overlap_harness --rank R --world N --id-file PATH [--device D]
//                   [--ops ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g,pr_rs,pr_ar]
//                   [--calls C] [--m M --n N --k K] [--comm-sms S] [--inject nccl|cuda|hang|grow]
//                   [--trace 1] [--grow G] [--watchdog S] [--stage-mirrors 1] [--hold-mutex H]
//
// Start one process per rank (tests/cuda/run_overlap_harness.sh does). Rank 0 writes the
// NCCL unique id to PATH; the others wait for it (at most 300 s). Every call gets fresh
// random bfloat16 inputs (a hash of rank, call and index, so every rank can build every
// rank's inputs), a poisoned (NaN) output, and is checked element by element against a
// float32 host reference (ag_g / ag_ce_g: the all-gathers that also return the gathered rows,
// which must equal every rank's x bit for bit; pr_rs / pr_ar: the peer-store reduce-scatter /
// all-reduce at world 1, the rank its own peer (EnsurePeerStoresLoopback: everything of a
// pair's call but NVLink), block 0 of the result checked, an all-reduce's block 1 still
// poisoned: nothing but the peer writes it; at world > 1 the ranks' processes share their
// peer-store buffers by CUDA IPC (records through files beside the id file) and pr_rs / pr_ar
// are checked as rs / ar are (the all-reduce staged: peer_reduce_args.h). Prints one line per op and exits 0 only if every element of every
// call matched and no CUDA / NCCL call failed. --inject: before each op's calls, one call with
// an injected failure (fault_injection.h) that must fail naming the op, leaving the next fine.
// --trace 1: tracing on (xla_ffi/comm/trace.h); after each op, one record per successful call
// (none for the all-gather, which is not traced), its times in stream order.
// --grow G: meanwhile a second thread grows the workspaces G times, 8 MiB more each time
// (EnsureWorkspace waits until no call is in flight and holds calls off: quiesce.h); every
// call's values are still checked, and the workspaces must have grown (with pr ops, the
// peer-store buffers too: their signal words count calls across a growth). Registered windows
// grow collectively (every rank at the same point between calls: JAX's lowering barrier
// gives that, this thread would not), so with several ranks only the point-to-point
// communicator (plain cudaMalloc buffers) grows.
// --watchdog S: every communicator made with the watchdog on (S seconds): spin-kernel waits
// that read its abort flag, a check kernel after each call (xla_ffi/comm/watchdog.h).
// --inject with pr ops: a failed peer-store call breaks the pair for good (restart, as the
// handler's error says), so the call after it must be refused naming that; then the op ends.
// --stage-mirrors 1 (pr ops at world 1): the peer stores made with EnsurePeerStoresLoopback's
// stage_mirrors, as a group in one process whose XLA results the other GPUs may not write:
// the all-reduce mirrors into the staging area and copies it out (looped back, our own mirror
// lands in the one staging slot, copied out as the other rank's block: block 1 of the result
// must then equal block 0).
// --inject grow (one pr op, --world 1): before its calls, a growth of its peer-store buffers
// fails; the next call must be refused as not connected without breaking the pair, and a
// growth of the right size must connect it again (the calls after it checked as usual).
// --inject hang (one pr op, --watchdog S): its first call waits for a peer that never comes
// (fault_injection.h, kHang); the watchdog must report it after S s and end it (its abort
// makes the waits trap: the stream fails, the process must restart, so the harness exits
// there: 0 if the stream failed within S + 30 s). --hold-mutex H (with it): meanwhile this
// thread holds the communicator's call mutex for H s, as a handler blocked while enqueueing
// would: the watchdog must not abort (ncclCommAbort) until it is let go, then must at once.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <iterator>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/cuda/overlap_harness_data.h"
#include "tests/cuda/overlap_harness_options.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/peer_stores.h"
#include "xla_ffi/comm/trace.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace fo = flashoverlap;

namespace {

using overlap_harness::Check;
using overlap_harness::CheckCuda;
using overlap_harness::Fail;
using overlap_harness::HasPeerOps;
using overlap_harness::Options;
using overlap_harness::Parse;

// Three NCCL unique ids (the collective group, the point-to-point group and the collective
// group with CTA policy ZERO), from rank 0.
std::vector<ncclUniqueId> ExchangeIds(const Options& o) {
  std::vector<ncclUniqueId> ids(3);
  const size_t bytes = sizeof(ncclUniqueId::internal);
  if (o.rank == 0) {
    std::string tmp = o.id_file + ".tmp";
    std::ofstream file(tmp, std::ios::binary);
    for (auto& id : ids) {
      Check(fo::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"), "unique id");
      file.write(id.internal, bytes);
    }
    file.close();
    if (!file || std::rename(tmp.c_str(), o.id_file.c_str()) != 0) {
      Fail("cannot write " + o.id_file);
    }
    return ids;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(o.id_file, std::ios::binary);
    bool complete = static_cast<bool>(in);
    for (auto& id : ids) complete = complete && static_cast<bool>(in.read(id.internal, bytes));
    if (complete) return ids;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Fail("no NCCL ids in " + o.id_file + " after 300 s (is rank 0 running?)");
}

// A plan of `groups` bands over `rows` rows, deliberately uneven (tiles of varied heights).
std::vector<int> Bands(int64_t rows, int groups) {
  std::vector<int> b(groups + 1);
  for (int g = 0; g <= groups; ++g) b[g] = static_cast<int>(rows * g * g / (groups * groups));
  for (int g = 1; g <= groups; ++g) b[g] = std::max(b[g], b[g - 1] + 1);
  b[groups] = static_cast<int>(rows);
  return b;
}

fo::SignalingGemmArgs Gemm(const Options& o, const void* x, const void* w, void* out,
                           int32_t* counters, int blocks, const std::vector<int>& bands) {
  fo::SignalingGemmArgs a;
  a.x = x;
  a.w = w;
  a.out = out;
  a.m = o.m;
  a.n = o.n;
  a.k = o.k;
  a.dtype = fo::GemmDType::kBFloat16;
  a.counters = counters;
  a.comm_sms = o.comm_sms;
  a.layout.num_blocks = blocks;
  a.layout.num_groups = static_cast<int>(bands.size()) - 1;
  for (size_t g = 0; g < bands.size(); ++g) a.layout.band_rows[g] = bands[g];
  return a;
}

struct DeviceBuffers {
  void* x = nullptr;
  void* w = nullptr;
  void* out = nullptr;
  void* gathered = nullptr;  // [M, K]: the all-gathers' second result (ag_g, ag_ce_g)
};

// The workspace is NaN before every call: a GEMM tile that read rows before they arrived, or
// a call that used a buffer a growth swapped away, shows in the values.
constexpr bool kPoisonWorkspace = true;

bool IsAllGather(const std::string& op) { return op.rfind("ag", 0) == 0; }
bool IsPeer(const std::string& op) { return op.rfind("pr_", 0) == 0; }

// The ranks of a pr op's group: world 1 loops a pair back on one rank.
int64_t PeerWorld(const Options& o) { return o.world == 1 ? 2 : o.world; }

// The peer-store buffer a pr op needs: PeerRecvBlocks blocks of M / group x N bfloat16 (a
// pair: the peer's partial of our rows), and across processes the all-reduce's staging area.
size_t PeerRecvBytes(const Options& o) {
  const int world = static_cast<int>(PeerWorld(o));
  const bool staged = o.world > 1 || o.stage_mirrors;
  const int blocks = fo::PeerRecvBlocks(world) + (staged ? fo::PeerStageBlocks(world) : 0);
  return static_cast<size_t>(blocks) * (o.m / world) * o.n * 2;
}

// World > 1 (one rank per process): each rank's peer-store record (peer_ipc.h) through a file
// beside the id file, every rank's opened (what comm._grow_and_connect_peer_stores does
// through JAX's key-value store).
void ExchangePeerRecords(const Options& o) {
  std::vector<fo::PeerStoresRecord> mine;
  Check(fo::ExportPeerStores(1, &mine), "ExportPeerStores");
  if (mine.size() != 1) Fail("expected one peer-store record of this rank");
  auto path = [&o](int r) { return o.id_file + ".peer." + std::to_string(r); };
  const std::string tmp = path(o.rank) + ".tmp";
  std::ofstream(tmp, std::ios::binary).write(mine[0].bytes.data(), mine[0].bytes.size());
  if (std::rename(tmp.c_str(), path(o.rank).c_str()) != 0) Fail("cannot write " + path(o.rank));
  std::vector<std::string> records(o.world);
  for (int r = 0; r < o.world; ++r) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    for (;;) {
      std::ifstream in(path(r), std::ios::binary);
      if (in) {
        records[r].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) Fail("no peer-store record " + path(r) + " after 300 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Check(fo::ImportPeerStores(1, {{o.device, records}}), "ImportPeerStores");
}

// One overlapped call of `op` on this rank's buffers.
fo::Status CallOp(const std::string& op, const Options& o, fo::Communicator& coll,
                  fo::Communicator& p2p, fo::Communicator& zero, cudaStream_t stream,
                  const DeviceBuffers& d) {
  const int64_t world = o.world;
  if (op == "ar" || op == "rs" || op == "ar_out") {
    const bool rs = op == "rs";
    // ar_out: in place on the output (JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output); null: the
    // communicator's workspace.
    void* gemm_out = op == "ar_out" ? d.out : nullptr;
    // Counters null: the call sets the communicator's under its lock (overlap_calls.h).
    auto gemm = Gemm(o, d.x, d.w, gemm_out, nullptr, rs ? o.world : 1,
                     Bands(rs ? o.m / world : o.m, 3));
    return fo::RunGemmCollective(
        coll, stream, rs ? fo::CollectiveKind::kReduceScatter : fo::CollectiveKind::kAllReduce,
        gemm, d.out, kPoisonWorkspace, rs ? "harness_reduce_scatter" : "harness_all_reduce");
  }
  if (op == "a2a" || op == "a2a11") {
    const int split = op == "a2a" ? 0 : 1;
    fo::AllToAllShape shape{o.m, o.n, world, split == 0 ? o.m / world : o.m,
                            split == 0 ? o.n : o.n / world, split, split};
    auto gemm = Gemm(o, d.x, d.w, nullptr, nullptr, split == 0 ? o.world : 1,
                     Bands(shape.rows, 3));
    gemm.out_col_block = split == 1 ? static_cast<int>(shape.cols) : 0;
    return fo::RunGemmAllToAll(p2p, stream, shape, gemm, d.out, kPoisonWorkspace,
                               "harness_all_to_all");
  }
  // ag_ce: one ncclAllGather over the window of a CTA-policy-ZERO communicator. _g: the
  // gathered rows returned too (peer-to-peer: received straight into them).
  if (op == "ag" || op == "ag_g") {
    auto gemm = Gemm(o, nullptr, d.w, nullptr, nullptr, 1, {0, 1});
    return fo::RunAllGatherGemm(p2p, stream, d.x, o.m / world, /*chunks=*/2, gemm, d.out,
                                op == "ag_g" ? d.gathered : nullptr, kPoisonWorkspace,
                                "harness_all_gather");
  }
  if (op == "ag_ce" || op == "ag_ce_g") {
    auto gemm = Gemm(o, nullptr, d.w, nullptr, nullptr, 1, {0, 1});
    return fo::RunAllGatherGemm(zero, stream, d.x, o.m / world, /*chunks=*/1, gemm, d.out,
                                op == "ag_ce_g" ? d.gathered : nullptr, kPoisonWorkspace,
                                "harness_all_gather_collective");
  }
  if (op == "pr_rs" || op == "pr_ar") {  // peer stores (world 1: the rank its own peer)
    auto gemm = Gemm(o, d.x, d.w, nullptr, nullptr, 1, Bands(o.m / PeerWorld(o), 3));
    gemm.comm_sms = 0;  // as the peer plans have it: no SM is left to communication
    const bool rs = op == "pr_rs";
    return fo::RunGemmPeerReduce(
        coll, stream, rs ? fo::CollectiveKind::kReduceScatter : fo::CollectiveKind::kAllReduce,
        gemm, d.out, rs ? "harness_peer_reduce_scatter" : "harness_peer_all_reduce");
  }
  Fail("unknown op " + op + " (ar, ar_out, rs, a2a, a2a11, ag, ag_ce, ag_g, ag_ce_g, pr_rs, pr_ar)");
}

// --trace: the op's calls just made left one record each (injected failures none), ordered
// as their streams order them. Returns the number of bad records (a wrong count: one).
int64_t CheckTrace(const std::string& op, const Options& o) {
  std::vector<fo::TracedCall> calls;
  Check(fo::ReadTrace(/*clear=*/true, &calls), "ReadTrace");
  const size_t expected = IsAllGather(op) || IsPeer(op) ? 0 : static_cast<size_t>(o.calls);
  int64_t bad = calls.size() == expected ? 0 : 1;
  for (const fo::TracedCall& c : calls) {
    const size_t groups = c.band_rows.size() - 1;
    bool ok = groups == 3 && c.ready_ms.size() == groups && c.comm_done_ms.size() == groups &&
              c.gemm_done_ms.value_or(0) > 0 && c.copy_done_ms.has_value() == (op != "rs" && op != "ar_out");
    for (size_t g = 0; ok && g < groups; ++g) {
      ok = c.ready_ms[g] >= 0 && c.ready_ms[g] <= c.comm_done_ms[g] &&
           (g == 0 || c.comm_done_ms[g - 1] <= c.ready_ms[g]) &&
           (op != "ar" || (*c.copy_done_ms)[g] >= c.comm_done_ms[g]);
    }
    bad += ok ? 0 : 1;
  }
  std::string last;
  if (!calls.empty()) {
    last = ", last: GEMM done at " + std::to_string(calls.back().gemm_done_ms.value_or(-1)) +
           " ms, last group's NCCL at " + std::to_string(calls.back().comm_done_ms.back()) + " ms";
  }
  std::printf("rank %d %-5s trace: %zu records (expected %zu)%s  %s\n", o.rank, op.c_str(),
              calls.size(), expected, last.c_str(), bad == 0 ? "OK" : "FAIL");
  return bad;
}

// A call that must be refused: its status, and whether it was refused saying `reason`.
std::pair<fo::Status, bool> RefusedCall(const std::string& op, const Options& o, fo::Communicator& coll,
                                        fo::Communicator& p2p, fo::Communicator& zero,
                                        cudaStream_t stream, const DeviceBuffers& d, const char* reason) {
  fo::Status refused = CallOp(op, o, coll, p2p, zero, stream, d);
  CheckCuda(cudaStreamSynchronize(stream), "synchronize after the refused call");
  const bool says = !refused.ok() && refused.message.find(reason) != std::string::npos;
  return {std::move(refused), says};
}

// --inject with a pr op, after the injected failure: the pair is broken for good, so the next
// call must be refused, saying to restart. Returns 1 if it was not.
int64_t RefusedAfterFailure(const std::string& op, const Options& o, fo::Communicator& coll,
                            fo::Communicator& p2p, fo::Communicator& zero, cudaStream_t stream,
                            const DeviceBuffers& d) {
  const auto [refused, says] = RefusedCall(op, o, coll, p2p, zero, stream, d, "restart the process");
  std::printf("rank %d %-5s next call: %s  %s\n", o.rank, op.c_str(),
              refused.ok() ? "NOT REFUSED" : refused.message.c_str(), says ? "OK" : "FAIL");
  return says ? 0 : 1;
}

// --inject grow, before a pr op's calls: growing its peer-store buffers fails (no GPU has
// 32 TiB), leaving the member without a buffer and not connected; the next call must then be
// refused as not connected, without breaking the pair (no program with the call ran
// anywhere: the growth is a lowering's), and a growth of the right size must connect it
// again, the calls after it right. Returns 1 if any of that did not hold.
int64_t FailedGrowthRefusedThenRegrown(const std::string& op, const Options& o, fo::Communicator& coll,
                                       fo::Communicator& p2p, fo::Communicator& zero,
                                       cudaStream_t stream, const DeviceBuffers& d) {
  const fo::Status grown = fo::EnsurePeerStoresLoopback(1, size_t{1} << 45, o.stage_mirrors);
  const bool dropped = !grown.ok() && coll.peer.buffers.recv == nullptr && !coll.peer_connected;
  const auto [refused, says] = RefusedCall(op, o, coll, p2p, zero, stream, d, "not connected");
  const bool broken = coll.peer_broken.load();
  const bool ok = dropped && says && !broken;
  std::printf("rank %d %-5s failed growth: %s | buffer dropped: %s | next call: %s | broken: %s  %s\n",
              o.rank, op.c_str(), grown.ok() ? "NOT REPORTED" : grown.message.c_str(),
              dropped ? "yes" : "NO", refused.ok() ? "NOT REFUSED" : refused.message.c_str(),
              broken ? "YES" : "no", ok ? "OK" : "FAIL");
  std::fflush(stdout);  // before the regrowth, which a broken pair may refuse (exit 2)
  Check(fo::EnsurePeerStoresLoopback(1, PeerRecvBytes(o), o.stage_mirrors), "peer stores (regrown)");
  return ok && coll.peer_connected ? 0 : 1;
}

// --inject hang: the call's wait for its peer never ends but by the watchdog, whose abort
// makes the wait trap: the stream fails, the CUDA context is gone, so the process ends here
// (0: the stream failed after the watchdog's S s and within S + 30 s).
[[noreturn]] void HangEndedByWatchdog(const std::string& op, const Options& o, fo::Communicator& coll,
                                      fo::Communicator& p2p, fo::Communicator& zero,
                                      cudaStream_t stream, const DeviceBuffers& d) {
  fo::SetFaultInjection(fo::FaultKind::kHang, 1);
  const auto start = std::chrono::steady_clock::now();
  fo::Status s = CallOp(op, o, coll, p2p, zero, stream, d);
  fo::SetFaultInjection(fo::FaultKind::kNone, 0);
  if (!s.ok()) {
    std::printf("rank %d %-5s hang: the call was not enqueued: %s  FAIL\n", o.rank, op.c_str(), s.message.c_str());
    std::fflush(stdout);
    std::_Exit(1);
  }
  bool held_ok = true;
  if (o.hold_mutex > 0) {  // the abort must wait for the mutex: ncclCommAbort frees the comm
    std::unique_lock<std::mutex> lock(coll.call_mutex);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.hold_mutex));
    const bool aborted_while_held = coll.aborted.load();
    lock.unlock();
    const auto released = std::chrono::steady_clock::now();
    while (!coll.aborted.load() && std::chrono::steady_clock::now() - released < std::chrono::seconds(5)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - released).count();
    held_ok = !aborted_while_held && coll.aborted.load();
    std::printf("rank %d %-5s hold: aborted while its call mutex was held %.1f s: %s; after: %s (%.2f s)  %s\n",
                o.rank, op.c_str(), o.hold_mutex, aborted_while_held ? "YES" : "no",
                coll.aborted.load() ? "yes" : "NO", after, held_ok ? "OK" : "FAIL");
    std::fflush(stdout);
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool ok = held_ok && e != cudaSuccess && seconds >= o.watchdog && seconds < o.watchdog + 30 + o.hold_mutex;
  std::printf("rank %d %-5s hang: the stream %s after %.1f s (%s)  %s\n", o.rank, op.c_str(),
              e == cudaSuccess ? "finished" : "failed", seconds, cudaGetErrorString(e), ok ? "OK" : "FAIL");
  std::fflush(stdout);
  std::_Exit(ok ? 0 : 1);
}

// Runs `calls` calls of one op; returns the number of mismatching elements.
int64_t RunOp(const std::string& op, const Options& o, fo::Communicator& coll,
              fo::Communicator& p2p, fo::Communicator& zero, cudaStream_t stream,
              const DeviceBuffers& d) {
  const int64_t rank = o.rank;
  int64_t bad = 0, checked = 0;
  double max_err = 0;
  for (int call = 0; call < o.calls; ++call) {
    // ar_out / ag_* compute what ar / ag do (another buffer, another communicator); pr_rs /
    // pr_ar what rs / ar do (world 1: the looped-back pair's block 0).
    const std::string math = op == "ar_out" ? "ar" : IsAllGather(op) ? "ag"
                             : IsPeer(op) ? (o.world == 1 ? "pr" : op.substr(3)) : op;
    const bool gathered = op == "ag_g" || op == "ag_ce_g";
    Problem p = MakeProblem(math, o.m, o.n, o.k, o.world, o.rank, /*seed=*/1000 * call + 17);
    // pr_ar: block 1 of the result is the peer's to write; looped back, nothing does (staged:
    // our own mirror, copied out of the staging slot; --stage-mirrors).
    if (op == "pr_ar" && o.world == 1) {
      const size_t half = p.expected.size();
      p.expected.resize(2 * half, std::nanf(""));
      if (o.stage_mirrors) std::copy(p.expected.begin(), p.expected.begin() + half, p.expected.begin() + half);
    }
    CheckCuda(cudaMemcpy(d.x, p.x.data(), p.x.size() * 2, cudaMemcpyHostToDevice), "copy x");
    CheckCuda(cudaMemcpy(d.w, p.w.data(), p.w.size() * 2, cudaMemcpyHostToDevice), "copy w");
    CheckCuda(cudaMemset(d.out, 0xff, p.expected.size() * 2), "poison out");  // bf16 NaN
    CheckCuda(cudaMemset(d.gathered, 0xff, o.m * o.k * 2), "poison gathered");
    if (o.inject == "hang") HangEndedByWatchdog(op, o, coll, p2p, zero, stream, d);
    if (o.inject == "grow" && call == 0) bad += FailedGrowthRefusedThenRegrown(op, o, coll, p2p, zero, stream, d);
    if (o.inject == "nccl" || o.inject == "cuda") {  // first an injected failure: it must name the op, then clear
      fo::SetFaultInjection(o.inject == "nccl" ? fo::FaultKind::kNccl : fo::FaultKind::kCuda, 1);
      fo::Status failed = CallOp(op, o, coll, p2p, zero, stream, d);
      fo::SetFaultInjection(fo::FaultKind::kNone, 0);
      CheckCuda(cudaStreamSynchronize(stream), "synchronize after the injected failure");
      const bool named = failed.message.find("harness_") == 0 &&
                         failed.message.find("injected") != std::string::npos;
      std::printf("rank %lld %-5s injected %s fault: %s\n", static_cast<long long>(rank),
                  op.c_str(), o.inject.c_str(),
                  failed.ok() ? "NOT REPORTED" : failed.message.c_str());
      if (failed.ok() || !named) ++bad;
      CheckCuda(cudaMemset(d.out, 0xff, p.expected.size() * 2), "poison out");
      if (IsPeer(op)) return bad + RefusedAfterFailure(op, o, coll, p2p, zero, stream, d);
    }
    fo::Status s = CallOp(op, o, coll, p2p, zero, stream, d);
    Check(s, op.c_str());
    CheckCuda(cudaStreamSynchronize(stream), "synchronize");
    std::vector<uint16_t> got(p.expected.size());
    CheckCuda(cudaMemcpy(got.data(), d.out, got.size() * 2, cudaMemcpyDeviceToHost), "copy out");
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(double(BF16ToFloat(got[i])) - p.expected[i]);
      // NaN expected: still the poison (nothing may write there); else false for NaN.
      const bool ok = std::isnan(p.expected[i]) ? std::isnan(BF16ToFloat(got[i]))
                                                : err <= 0.03 + 0.02 * std::fabs(p.expected[i]);
      if (!ok && bad < 5) {
        std::printf("  %s call %d: element %zu = %g, expected %g\n", op.c_str(), call, i,
                    BF16ToFloat(got[i]), p.expected[i]);
      }
      bad += ok ? 0 : 1;
      if (!std::isnan(err) && err > max_err) max_err = err;
    }
    checked += static_cast<int64_t>(got.size());
    if (gathered) {  // the gathered rows: every rank's x, bit for bit (NaN poison never is)
      std::vector<uint16_t> rows(p.gathered.size());
      CheckCuda(cudaMemcpy(rows.data(), d.gathered, rows.size() * 2, cudaMemcpyDeviceToHost),
                "copy gathered");
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] != p.gathered[i] && bad < 5) {
          std::printf("  %s call %d: gathered element %zu = 0x%04x, expected 0x%04x\n",
                      op.c_str(), call, i, rows[i], p.gathered[i]);
        }
        bad += rows[i] == p.gathered[i] ? 0 : 1;
      }
      checked += static_cast<int64_t>(rows.size());
    }
  }
  std::printf("rank %lld %-5s calls %d  elements %lld  mismatches %lld  max_abs_err %.4f  %s\n",
              static_cast<long long>(rank), op.c_str(), o.calls, static_cast<long long>(checked),
              static_cast<long long>(bad), max_err, bad == 0 ? "OK" : "FAIL");
  return bad + (o.trace ? CheckTrace(op, o) : 0);
}

// --grow: grows the workspaces of `comm_ids` o.grow times from a second thread while the
// ops run, 8 MiB more each time, 20 ms apart.
class Grower {
 public:
  // peer: also grow the peer-store buffers of comm_id 1 (loopback), from PeerRecvBytes(o).
  Grower(const Options& o, std::vector<int64_t> comm_ids, size_t base_bytes, fo::Communicator* peer)
      : o_(o), comm_ids_(std::move(comm_ids)), base_(base_bytes), peer_(peer) {
    if (o.grow > 0) thread_ = std::thread([this] { Run(); });
  }
  // Joins the thread; returns 1 if a growth failed or a workspace did not grow, else 0.
  int64_t Finish() {
    if (!thread_.joinable()) return 0;
    const int while_running = done_.load();  // the ops have all run by now
    thread_.join();
    const size_t want = Target(o_.grow);
    bool grew = status_.ok();
    for (const fo::CommunicatorSummary& c : fo::ListCommunicators()) {
      const bool ours = std::find(comm_ids_.begin(), comm_ids_.end(), c.comm_id) != comm_ids_.end();
      if (ours && c.workspace_bytes < want) grew = false;
    }
    const size_t peer_want = PeerTarget(o_.grow);
    if (peer_ != nullptr && peer_->peer_recv_bytes < peer_want) grew = false;
    const std::string peer_line = peer_ == nullptr ? "" : ", peer stores " +
        std::to_string(peer_->peer_recv_bytes) + " bytes (want >= " + std::to_string(peer_want) + ")";
    const std::string failure = status_.ok() ? "" : ": " + status_.message;
    std::printf("rank %d grow: %d of %d growths of %zu communicator(s) to %zu bytes%s, %d of them "
                "while the ops ran%s  %s\n",
                o_.rank, done_.load(), o_.grow, comm_ids_.size(), want, peer_line.c_str(),
                while_running, failure.c_str(), grew ? "OK" : "FAIL");
    return grew ? 0 : 1;
  }

 private:
  // `base` grown `step` times by 8 MiB.
  static size_t Grown(size_t base, int step) { return base + static_cast<size_t>(step) * (size_t{8} << 20); }
  size_t Target(int step) const { return Grown(base_, step); }
  size_t PeerTarget(int step) const { return Grown(PeerRecvBytes(o_), step); }
  void Run() {
    for (int step = 1; step <= o_.grow; ++step) {
      for (int64_t id : comm_ids_) {
        fo::Status s = fo::EnsureWorkspace(id, Target(step));
        if (!s.ok()) {
          status_ = s;
          return;
        }
      }
      if (peer_ != nullptr) {
        fo::Status s = fo::EnsurePeerStoresLoopback(1, PeerTarget(step), o_.stage_mirrors);
        if (!s.ok()) {
          status_ = s;
          return;
        }
      }
      ++done_;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const Options& o_;
  const std::vector<int64_t> comm_ids_;
  const size_t base_;
  fo::Communicator* const peer_;
  std::thread thread_;
  fo::Status status_;
  std::atomic<int> done_{0};
};

}  // namespace

int main(int argc, char** argv) {
  Options o = Parse(argc, argv);
  int count = 0;
  CheckCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (o.device < 0) o.device = o.rank % count;
  CheckCuda(cudaSetDevice(o.device), "cudaSetDevice");
  std::vector<ncclUniqueId> ids = ExchangeIds(o);

  const size_t bytes = std::max<size_t>(2 * o.m * o.n * 2, o.m * o.k * 2);
  const std::vector<fo::LocalRank> local = {{o.rank, o.device}};
  Check(fo::CreateCommunicators(1, ids[0], o.world, local, o.comm_sms, bytes, o.watchdog),
        "collective comm");
  Check(fo::CreateCommunicators(2, ids[1], o.world, local, o.comm_sms, bytes, o.watchdog,
                                /*peer_to_peer=*/true), "point-to-point comm");
  Check(fo::ConnectPeers(2), "ConnectPeers");
  Check(fo::CreateCommunicators(3, ids[2], o.world, local, o.comm_sms, bytes, o.watchdog,
                                /*peer_to_peer=*/false, /*cta_policy=*/2), "zero-policy comm");
  // Sized before the first call, as the ops' lowering does (comm.ensure_communicators).
  if (HasPeerOps(o) && o.world == 1) {
    Check(fo::EnsurePeerStoresLoopback(1, PeerRecvBytes(o), o.stage_mirrors), "peer stores (loopback)");
  } else if (HasPeerOps(o)) {  // one rank per process: buffers here, the others' opened
    Check(fo::EnsurePeerStores(1, PeerRecvBytes(o)), "peer stores");
    ExchangePeerRecords(o);
  }
  if (o.trace) Check(fo::SetTraceEnabled(true, fo::kDefaultTraceCapacity), "SetTraceEnabled");
  fo::Communicator* coll = fo::FindCommunicator(1, o.device);
  fo::Communicator* p2p = fo::FindCommunicator(2, o.device);
  fo::Communicator* zero = fo::FindCommunicator(3, o.device);

  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceBuffers d;
  CheckCuda(cudaMalloc(&d.x, o.m * o.k * 2), "malloc x");
  CheckCuda(cudaMalloc(&d.w, o.k * o.n * 2), "malloc w");
  CheckCuda(cudaMalloc(&d.out, o.world * o.m * o.n * 2), "malloc out");
  CheckCuda(cudaMalloc(&d.gathered, o.m * o.k * 2), "malloc gathered");
  int64_t bad = 0;
  const std::vector<int64_t> growing = o.world == 1 ? std::vector<int64_t>{1, 2, 3}
                                                    : std::vector<int64_t>{2};
  Grower grower(o, growing, bytes, HasPeerOps(o) ? coll : nullptr);
  std::string ops = o.ops + ",";
  for (size_t at = 0, next; (next = ops.find(',', at)) != std::string::npos; at = next + 1) {
    if (next > at) bad += RunOp(ops.substr(at, next - at), o, *coll, *p2p, *zero, stream, d);
  }
  bad += grower.Finish();
  CheckCuda(cudaFree(d.x), "free");
  CheckCuda(cudaFree(d.w), "free");
  CheckCuda(cudaFree(d.out), "free");
  CheckCuda(cudaFree(d.gathered), "free");
  CheckCuda(cudaStreamDestroy(stream), "stream destroy");
  Check(fo::DestroyCommunicators(0), "destroy communicators");
  std::printf("rank %d: %s\n", o.rank, bad == 0 ? "all calls matched" : "MISMATCHES");
  return bad == 0 ? 0 : 1;
}
