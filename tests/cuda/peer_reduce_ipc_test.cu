// The peer-store reduce-scatter and all-reduce with every rank in a process of its own
// (xla_ffi/comm/peer_ipc.h): each rank's recv buffer and signal words reach the others as CUDA
// IPC handles (records through files here; JAX's key-value store in the extension), and each
// rank's GEMM stores into the buffers it opened. Rank r runs on GPU r % (visible GPUs): on one
// GPU the ranks' processes share it by time slices (slow, but every wait is crossed the same
// way), on several each stores over NVLink.
//   peer_reduce_ipc_test check [--world N] [--json PATH]
//   peer_reduce_ipc_test bench_staged [--iters N] [--json PATH]  (one process: what staging costs)
// Per rank: reduce-scatter and all-reduce calls back to back with fresh inputs (the all-reduce
// staged: each rank mirror-stores its block into the others' staging areas, each copies them
// out), results poisoned first, each against float32 and bit for bit against the ring's
// rounded running sum of every rank's plain GEMM (every process makes every rank's inputs from
// the same seeds); then every rank closes its mappings of the others' recv, and (a barrier
// later) replaces its own with a larger one (a second generation) that the others open, and
// more calls on a larger shape. The parent starts the ranks before touching CUDA, waits for
// them (300 s at most, then kills them: FAIL) and exits 1 if any failed. PATH gets ".rank<r>".
// A rank is this program run again (--child RANK DIR ...), under PEER_IPC_WRAP's words if set
// (a sanitizer per rank).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "peer_reduce_common.cuh"
#include "../../xla_ffi/comm/peer_ipc.h"

namespace {

constexpr int kWaitSeconds = 120;  // for a file of another rank

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Waits for `path` (another rank's), or exits 3 naming it.
void WaitForFile(const std::string& path) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kWaitSeconds);
  while (!Exists(path)) {
    if (std::chrono::steady_clock::now() > until) {
      fprintf(stderr, "waited %d s for %s\n", kWaitSeconds, path.c_str());
      exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Written whole, then renamed: a reader never sees part of it.
void WriteFile(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::binary).write(bytes.data(), bytes.size());
  if (rename(tmp.c_str(), path.c_str()) != 0) { perror("rename"); exit(2); }
}

std::string ReadFile(const std::string& path) {
  WaitForFile(path);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every rank at `name` before any goes on.
void Barrier(const std::string& dir, const std::string& name, int rank, int world) {
  WriteFile(dir + "/" + name + "." + std::to_string(rank), "");
  for (int i = 0; i < world; ++i) WaitForFile(dir + "/" + name + "." + std::to_string(i));
}

// One rank in its process: its buffers, and the others' as opened here.
struct IpcRank {
  PeerReduceRank r;
  int device;
  cudaStream_t compute;
  void* recv = nullptr;
  size_t recv_bytes = 0;
  uint64_t generation = 0;
  std::unique_ptr<Buf> signals, queue;
  PeerMappings mapped;

  IpcRank(int rank, int world, int on_device) : device(on_device) {
    CK(cudaSetDevice(device));
    r.buffers.rank = rank;
    r.buffers.world = world;
    r.buffers.mirror_staged = true;  // the others' results are in their processes
    CK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    r.wait_method = ChosenWaitMethod(device);
    r.write_method = ChosenWriteMethod();
    CK(LoadSpinWaitKernel());  // as EmulatedRank: no lazy load behind a waiting GEMM
    CK(LoadWriteFlagKernel());
    signals = std::make_unique<Buf>(sizeof(int32_t) * kPeerSignalWords);
    queue = std::make_unique<Buf>(kGemmQueueBytes);
    CK(cudaMemset(signals->p, 0, sizeof(int32_t) * kPeerSignalWords));
    r.buffers.signals = static_cast<int32_t*>(signals->p);
  }
  // A new recv of `bytes` (NaN: a read before the stores shows), the old one freed: only once
  // every rank's calls that store into it are done (the caller's barrier).
  void NewRecv(size_t bytes) {
    if (recv != nullptr) CK(cudaFree(recv));
    CK(cudaMalloc(&recv, bytes));
    CK(cudaMemset(recv, 0xFF, bytes));
    CK(cudaDeviceSynchronize());
    recv_bytes = bytes;
    ++generation;
    r.buffers.recv = recv;
  }
  // Publishes this generation's record and opens every other rank's of the same generation.
  void Exchange(const std::string& dir, int world) {
    const int rank = r.buffers.rank;
    std::string mine;
    Must(MakePeerRecord(device, recv, recv_bytes, r.buffers.signals, generation, &mine), "MakePeerRecord");
    auto path = [&](int i) { return dir + "/record." + std::to_string(generation) + "." + std::to_string(i); };
    WriteFile(path(rank), mine);
    for (int i = 0; i < world; ++i) {
      if (i == rank) {
        r.buffers.peers_recv[i] = recv;
        r.buffers.peers_signals[i] = r.buffers.signals;
        continue;
      }
      PeerRecord record;
      Must(ParsePeerRecord(ReadFile(path(i)), &record), "ParsePeerRecord");
      if (MadeHere(record) || record.generation != generation || record.recv_bytes != recv_bytes) {
        fprintf(stderr, "rank %d: rank %d's record is not what it should be\n", rank, i);
        exit(2);
      }
      Must(OpenPeerRecord(record, i, &mapped), "OpenPeerRecord");
      r.buffers.peers_recv[i] = mapped.recv[i];
      r.buffers.peers_signals[i] = mapped.signals[i];
    }
  }
};

// Rank `rank`'s x for call `call` and w (every process makes every rank's the same way).
uint64_t SeedX(int rank, int call) { return 70000 + 1000 * uint64_t(rank) + 7 * uint64_t(call); }
uint64_t SeedW(int rank) { return 90000 + 1000 * uint64_t(rank); }

// `calls` reduce-scatters or all-reduces of `c` by this rank, then each result checked
// (Judge's verdict): our block of the sum (reduce-scatter) or every block (all-reduce, ours
// computed here, the others' mirror-stored into our staging area by their ranks and copied).
void RunCase(IpcRank& me, const Case& c, PeerReduceKind kind, int calls, int world, cudaStream_t s) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int rank = me.r.buffers.rank;
  const int64_t rows = c.m / world, x_elems = c.m * c.k, w_elems = c.k * c.n;
  const int64_t out_rows = ar ? c.m : rows, out_elems = out_rows * c.n;
  std::vector<std::unique_ptr<Buf>> x(world), w(world), result(calls);
  for (int j = 0; j < world; ++j) {
    w[j] = std::make_unique<Buf>(w_elems * 2);
    Fill(w[j]->p, w_elems, c.dt, SeedW(j), s);
  }
  std::vector<std::unique_ptr<Buf>> own_x(calls);
  for (int i = 0; i < calls; ++i) {
    own_x[i] = std::make_unique<Buf>(x_elems * 2);
    Fill(own_x[i]->p, x_elems, c.dt, SeedX(rank, i), s);
    result[i] = std::make_unique<Buf>(out_elems * 2);
    CK(cudaMemsetAsync(result[i]->p, 0xFF, out_elems * 2, s));
  }
  CK(cudaStreamSynchronize(s));
  SignalingGemmArgs base;
  base.m = c.m;
  base.n = c.n;
  base.k = c.k;
  base.dtype = c.dt;
  base.comm_sms = 0;
  base.layout = BandLayout(c.bands);
  bool split = false;
  for (int i = 0; i < calls; ++i) {
    SignalingGemmArgs g = base;
    g.x = own_x[i]->p;
    g.w = w[rank]->p;
    g.queue = me.queue->p;
    g.add_serial = i % 2 == 1;
    Must(EnqueuePeerReduce(me.r, me.compute, kind, g, result[i]->p), "EnqueuePeerReduce");
    split = split || LastLaunchSplit();
  }
  CK(cudaStreamSynchronize(me.compute));
  // References of our rows (reduce-scatter: block `rank`; all-reduce: every block): the fp32
  // sum of every rank's x[rows] @ w, and the ring's rounded running sum of their plain GEMMs
  // (SumRoundedRing; a reduce-scatter's one block with the products turned so that q[i] is
  // rank (i + rank)'s: block `rank`'s order).
  const int64_t first_row = ar ? 0 : rank * rows;
  Buf ref(out_elems * 4), ref_j(out_elems * 4), exact(out_elems * 2), scratch(kGemmQueueBytes);
  std::vector<std::unique_ptr<Buf>> prod(world);
  std::vector<void*> order(world);
  for (int j = 0; j < world; ++j) prod[j] = std::make_unique<Buf>(out_elems * 2);
  for (int j = 0; j < world; ++j) order[j] = prod[ar ? j : (j + rank) % world]->p;
  for (int i = 0; i < calls; ++i) {
    for (int j = 0; j < world; ++j) {
      x[j] = std::make_unique<Buf>(x_elems * 2);
      Fill(x[j]->p, x_elems, c.dt, SeedX(j, i), s);
      const char* x_rows = static_cast<const char*>(x[j]->p) + first_row * c.k * 2;
      Reference(x_rows, w[j]->p, (float*)(j == 0 ? ref.p : ref_j.p), int(out_rows), int(c.n), int(c.k), c.dt, s);
      if (j > 0) AddF32<<<1024, 256, 0, s>>>((const float*)ref_j.p, (float*)ref.p, out_elems);
      CK(cudaGetLastError());
      for (int64_t b = 0; b < out_rows / rows; ++b) {  // plain GEMMs per block, as the ring has them
        SignalingGemmArgs g = base;
        g.x = x_rows + b * rows * c.k * 2;
        g.w = w[j]->p;
        g.m = rows;
        g.out = static_cast<char*>(prod[j]->p) + b * rows * c.n * 2;
        g.queue = scratch.p;
        MustLaunch(LaunchSignalingGemm(g, s), "plain GEMM");
        split = split || LastLaunchSplit();
      }
    }
    SumRoundedRingOn(order, rows * c.n, exact.p, c.dt, s, /*blocks=*/ar ? world : 1);
    const Verdict v = Compare(result[i]->p, (const float*)ref.p, out_rows, c.n, c.dt, s, world - 1);
    const unsigned long long diff = Different(result[i]->p, exact.p, out_elems, s);
    Judge(("ipc" + std::to_string(world)).c_str(), ar, c, i, rank, v, diff, !split);
  }
}

// The recv a rank needs for `c`: the running sums' blocks and the staged all-reduce's area.
size_t RecvBytesFor(const Case& c, int world) {
  return size_t(PeerRecvBlocks(world) + PeerStageBlocks(world)) * (c.m / world) * c.n * 2;
}

int RunRank(int rank, int world, const std::string& dir, const std::string& json_path) {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  CK(cudaSetDevice(rank % count));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  IpcRank me(rank, world, rank % count);
  printf("rank %d (pid %d) on GPU %d of %d\n", rank, int(getpid()), me.device, count);
  fflush(stdout);
  // Phase 1: two shapes on the first buffers.
  const Case a{600, 272, 200, {0, int(600 / world / 3), int(600 / world)}, GemmDType::kFloat16};
  const Case b{2400, 1024, 512, EvenBands(2400 / world, 2, 256), GemmDType::kBFloat16};
  me.NewRecv(RecvBytesFor(b, world));
  me.Exchange(dir, world);
  Barrier(dir, "opened1", rank, world);
  for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
    RunCase(me, a, kind, 3, world, s);
    RunCase(me, b, kind, 3, world, s);
  }
  // Phase 2: every rank's calls done (nothing stores into the old buffers), every rank's
  // mappings of them closed (an owner's free before that is undefined), then larger ones.
  Barrier(dir, "phase1", rank, world);
  Must(ClosePeerMappings(&me.mapped, /*keep_signals=*/true), "ClosePeerMappings (recv)");
  Barrier(dir, "closed", rank, world);
  const Case c{4800, 2048, 1024, EvenBands(4800 / world, 4, 256), GemmDType::kBFloat16};
  me.NewRecv(RecvBytesFor(c, world));
  me.Exchange(dir, world);
  Barrier(dir, "opened2", rank, world);
  RunCase(me, c, PeerReduceKind::kAllReduce, 2, world, s);
  RunCase(me, c, PeerReduceKind::kReduceScatter, 2, world, s);
  Barrier(dir, "end", rank, world);  // the others' last credits into our words are written
  Must(ClosePeerMappings(&me.mapped), "ClosePeerMappings");
  CK(cudaFree(me.recv));
  TestDevice d{s, nullptr};
  CK(cudaMalloc(&d.counters, sizeof(int) * kMaxGroups));
  char fields[64];
  snprintf(fields, sizeof fields, ",\"world\":%d,\"rank\":%d", world, rank);
  return FinishTest(d, "ipc check rank " + std::to_string(rank),
                    json_path.empty() ? "" : json_path + ".rank" + std::to_string(rank), fields);
}

// What staging costs, on one GPU in one process (no IPC, no time slices): a rank that is its
// own peer (a pair looped back), per DESIGN.md shape, on every SM: our GEMM alone, the
// all-reduce as in one process (mirrors into the "other" result), the same staged (mirrors
// into the staging area, then the copy-out), and the reduce-scatter; interleaved, median of
// --iters samples of 5 calls. The staged variant's result block 1 is a copy of block 0 (the
// rank mirrors to itself), which is all a timing needs.
void BenchStaged(cudaStream_t s, int* counters, int iters) {
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s %7s %7s %7s | %s\n", "per-GPU M x N x K", "GEMM", "AR", "AR stg", "RS",
         "over GEMM: AR, AR staged, RS");
  uint64_t seed = 80000;
  for (const Shape3& c : kDesignShapes) {
    const int64_t rows = c.m / 2;
    Problem p({c.m, c.n, c.k}, GemmDType::kBFloat16, seed += 10, s, /*with_ref=*/false);
    EmulatedRank plain(0, rows, c.n), staged(0, rows, c.n, -1, 2, PeerStageBlocks(2));
    plain.PeerWith(plain, 1);
    staged.PeerWith(staged, 1);
    staged.r.buffers.mirror_staged = true;
    Buf result(c.m * c.n * 2);
    SignalingGemmArgs whole = p.Args(EvenLayout(c.m, 1, 1, 256), 0);
    whole.counters = counters;
    auto gemm = [&]() {
      for (int i = 0; i < kCallsPerSample; ++i) {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        MustLaunch(LaunchSignalingGemm(whole, s), "GEMM");
      }
    };
    auto sequence = [&](EmulatedRank& rank, PeerReduceKind kind) {
      SignalingGemmArgs seq = p.base;
      seq.comm_sms = 0;
      seq.layout = BandLayout(EvenBands(rows, 2, 256));
      seq.queue = rank.queue->p;
      return [&, kind, seq]() {
        for (int i = 0; i < kCallsPerSample; ++i) Must(EnqueuePeerReduce(rank.r, s, kind, seq, result.p), "sequence");
      };
    };
    const std::vector<float> t = TimeInterleaved(
        {gemm, sequence(plain, PeerReduceKind::kAllReduce), sequence(staged, PeerReduceKind::kAllReduce),
         sequence(plain, PeerReduceKind::kReduceScatter)}, s, iters);
    std::vector<double> ms;
    for (float v : t) ms.push_back(v / kCallsPerSample);
    char shape[40];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-18s | %7.3f %7.3f %7.3f %7.3f | %.3f %.3f %.3f\n", shape, ms[0], ms[1], ms[2], ms[3],
           ms[1] / ms[0], ms[2] / ms[0], ms[3] / ms[0]);
    char buf[400];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench_staged\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"gemm_ms\":%.4f,"
             "\"all_reduce_ms\":%.4f,\"all_reduce_staged_ms\":%.4f,\"reduce_scatter_ms\":%.4f}",
             (long long)c.m, (long long)c.n, (long long)c.k, ms[0], ms[1], ms[2], ms[3]);
    AddJson(buf);
    fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A rank: peer_reduce_ipc_test --child RANK DIR MODE [options] (the parent starts these).
  if (argc >= 4 && !strcmp(argv[1], "--child")) {
    const int rank = atoi(argv[2]);
    const std::string dir = argv[3];
    std::vector<char*> rest = {argv[0]};
    for (int i = 4; i < argc; ++i) rest.push_back(argv[i]);
    const Options o = ParseOptions(int(rest.size()), rest.data());
    return RunRank(rank, o.world, dir, o.json_path);
  }
  const Options o = ParseOptions(argc, argv);
  if (o.mode == "bench_staged") {
    TestDevice d = StartTestDevice();
    BenchStaged(d.stream, d.counters, o.iters);
    return FinishTest(d, o.mode, o.json_path);
  }
  if (o.mode != "check" && o.mode != "all") {
    fprintf(stderr, "unknown mode %s (check, bench_staged)\n", o.mode.c_str());
    return 2;
  }
  if (600 % o.world) {
    fprintf(stderr, "--world must divide the cases' rows (2, 3, 4, 5, 6 or 8), got %d\n", o.world);
    return 2;
  }
  char dir_template[] = "/tmp/peer_ipc_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) { perror("mkdtemp"); return 2; }
  fflush(stdout);
  // Each rank a program of its own (exec, not only fork: CUDA sees a fresh process, as it
  // would a JAX process per GPU), run under PEER_IPC_WRAP's words if set (e.g.
  // "compute-sanitizer --tool memcheck --error-exitcode 9": one sanitizer per rank).
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) { perror("readlink"); return 2; }
  std::vector<std::string> wrap;
  if (const char* w = getenv("PEER_IPC_WRAP")) {
    std::istringstream words(w);
    for (std::string word; words >> word;) wrap.push_back(word);
  }
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.world; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
      std::vector<std::string> args = wrap;
      args.insert(args.end(), {self, "--child", std::to_string(rank), dir, "check", "--world",
                               std::to_string(o.world)});
      if (!o.json_path.empty()) args.insert(args.end(), {"--json", o.json_path});
      std::vector<char*> raw;
      for (std::string& a : args) raw.push_back(a.data());
      raw.push_back(nullptr);
      execvp(raw[0], raw.data());
      perror("execvp");
      _exit(2);
    }
    children.push_back(pid);
  }
  int failed = 0, left = o.world;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (left > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --left;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      failed += !ok;
      if (!ok) printf("a rank (pid %d) ended with status %d\n", int(done), status);
    } else if (std::chrono::steady_clock::now() > until) {
      printf("ranks still running after 300 s: killed  FAIL\n");
      for (pid_t pid : children) kill(pid, SIGKILL);
      while (waitpid(-1, nullptr, 0) > 0) {}
      return 1;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  printf("ipc check, %d ranks in processes of their own: %s\n", o.world, failed ? "FAIL" : "PASS");
  return failed ? 1 : 0;
}
