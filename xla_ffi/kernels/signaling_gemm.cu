// Launcher of the signaling GEMM: validates arguments, picks the tile shape, builds the
// tile schedule (group order, panels) and dispatches to one of the instantiations.
// Host code only; the kernels live in signaling_gemm_<dtype>_<tile>.cu.
#include <cuda_runtime.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "signaling_gemm.h"
#include "signaling_gemm_instances.h"
#include "tile_schedule.h"

namespace flashoverlap {
namespace {

thread_local std::string g_last_error;
thread_local GemmLaunchInfo g_last_launch;

cudaError_t Fail(cudaError_t code, const std::string& msg) {
  g_last_error = msg;
  return code;
}

// Multiprocessor count and compute capability per device, read once (attributes are
// cheap, but this runs on every launch from several host threads).
struct DeviceInfo {
  int sms = 0;
  int major = 0, minor = 0;
};

cudaError_t GetDeviceInfo(int* device, DeviceInfo* info) {
  static std::atomic<int> sms_cache[kMaxDevices];
  static std::atomic<int> cc_cache[kMaxDevices];
  cudaError_t e = cudaGetDevice(device);
  if (e != cudaSuccess) return e;
  if (*device < 0 || *device >= kMaxDevices) return cudaErrorInvalidDevice;
  int sms = sms_cache[*device].load(std::memory_order_relaxed);
  int cc = cc_cache[*device].load(std::memory_order_relaxed);
  if (sms == 0 || cc == 0) {
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, *device)) != cudaSuccess) return e;
    int major = 0, minor = 0;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device)) != cudaSuccess) return e;
    cc = major * 10 + minor;
    sms_cache[*device].store(sms, std::memory_order_relaxed);
    cc_cache[*device].store(cc, std::memory_order_relaxed);
  }
  info->sms = sms;
  info->major = cc / 10;
  info->minor = cc % 10;
  return cudaSuccess;
}

// Optional integer override from the environment (tuning and tests only): unset or empty is
// `fallback`. Anything but an integer in [lo, hi] (blanks around it allowed, as
// _ext.check_kernel_integers) is `fallback` too, and with `error`, an error naming the variable
// there (atoi read a word as 0: SERPENTINE=true meant off).
int EnvInt(const char* name, int fallback, int lo = INT_MIN, int hi = INT_MAX,
           std::string* error = nullptr) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(v, &end, 10);
  const bool digits = end != v && std::isdigit(static_cast<unsigned char>(end[-1]));
  while (std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (digits && *end == '\0' && errno == 0 && value >= lo && value <= hi) return int(value);
  if (error != nullptr && error->empty())
    *error = std::string(name) + "='" + v + "' must be an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]";
  return fallback;
}

// Two-valued switches from the environment, for comparison runs: unset, empty or `usual`
// selects the default, `alternative` the other behaviour; anything else is an error naming
// the variable (a typo must not silently pick one).
struct EnvSwitch {
  const char* name;
  const char* usual;
  const char* alternative;
};
// static: the fixed round-robin order even when the caller gives a tile queue.
constexpr EnvSwitch kQueueSwitch{"FLASHOVERLAP_GEMM_QUEUE", "dynamic", "static"};
// whole: no split tail (whole units only; signaling_gemm.h).
constexpr EnvSwitch kTailSwitch{"FLASHOVERLAP_GEMM_TAIL", "split", "whole"};
// pingpong: where the 128x256 cooperative tiles would be used, 128x128 tiles, one per
// consumer warpgroup, computed in turn (signaling_gemm_consumers.cuh).
constexpr EnvSwitch kScheduleSwitch{"FLASHOVERLAP_GEMM_SCHEDULE", "cooperative", "pingpong"};

// Sets *alternative from the environment; returns "" or the error for a value it does not know.
std::string ReadSwitch(const EnvSwitch& sw, bool* alternative) {
  const char* v = std::getenv(sw.name);
  *alternative = v != nullptr && std::strcmp(v, sw.alternative) == 0;
  if (v == nullptr || *v == '\0' || *alternative || std::strcmp(v, sw.usual) == 0) return "";
  return std::string(sw.name) + " must be '" + sw.usual + "' or '" + sw.alternative + "', got '" + v + "'";
}

// FLASHOVERLAP_GEMM_EPILOGUE: overlap (unset or empty too), sync (the instances whose
// consumers store and signal each tile themselves, the design before the overlapped
// epilogue) or halves (the overlapped epilogue staged one warpgroup's rows at a time, 4
// mainloop stages at 128x256). Returns "" or the error for a value it does not know.
enum class Epilogue { kOverlap, kSync, kHalves };
constexpr const char* kEpilogueEnv = "FLASHOVERLAP_GEMM_EPILOGUE";
std::string ReadEpilogue(Epilogue* epilogue) {
  const char* v = std::getenv(kEpilogueEnv);
  *epilogue = Epilogue::kOverlap;
  if (v == nullptr || *v == '\0' || std::strcmp(v, "overlap") == 0) return "";
  if (std::strcmp(v, "sync") == 0) *epilogue = Epilogue::kSync;
  else if (std::strcmp(v, "halves") == 0) *epilogue = Epilogue::kHalves;
  else return std::string(kEpilogueEnv) + " must be 'overlap', 'sync' or 'halves', got '" + v + "'";
  return "";
}

// `adds`: the launch stores through add_from, mirrors or head groups, which the staged-in-
// halves instances leave to the whole-tile ones (their add ring and bulk mirrors).
const InstanceOps& PickInstance(GemmDType dtype, const GemmTileShape& ts, Epilogue epilogue,
                                bool transpose_w, bool several_mirrors, bool adds) {
  const bool wide = ts.block_n == 256, f16 = dtype == GemmDType::kFloat16;
  const bool sync_epilogue = epilogue == Epilogue::kSync;
  if (wide && epilogue == Epilogue::kHalves && !adds) {
    if (transpose_w) return f16 ? SignalingGemmF16Tile128x256HalvesNK() : SignalingGemmBf16Tile128x256HalvesNK();
    return f16 ? SignalingGemmF16Tile128x256Halves() : SignalingGemmBf16Tile128x256Halves();
  }
  if (several_mirrors && wide && !sync_epilogue) {  // a sync epilogue is refused for mirrors
    if (transpose_w) return f16 ? SignalingGemmF16Tile128x256OverlapNKPeer() : SignalingGemmBf16Tile128x256OverlapNKPeer();
    return f16 ? SignalingGemmF16Tile128x256OverlapPeer() : SignalingGemmBf16Tile128x256OverlapPeer();
  }
  if (transpose_w) {
    if (f16) return wide ? SignalingGemmF16Tile128x256OverlapNK() : SignalingGemmF16Tile128x128OverlapNK();
    return wide ? SignalingGemmBf16Tile128x256OverlapNK() : SignalingGemmBf16Tile128x128OverlapNK();
  }
  if (ts.block_n == 128 && ts.cluster_m == 2)  // the ping-pong shape (ChooseTileShape)
    return f16 ? SignalingGemmF16Tile128x128PingPong() : SignalingGemmBf16Tile128x128PingPong();
  if (sync_epilogue) {
    if (f16) return wide ? SignalingGemmF16Tile128x256() : SignalingGemmF16Tile128x128();
    return wide ? SignalingGemmBf16Tile128x256() : SignalingGemmBf16Tile128x128();
  }
  if (f16) return wide ? SignalingGemmF16Tile128x256Overlap() : SignalingGemmF16Tile128x128Overlap();
  return wide ? SignalingGemmBf16Tile128x256Overlap() : SignalingGemmBf16Tile128x128Overlap();
}

int64_t CeilDiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string ValidateLayout(const SignalingGemmArgs& a) {
  const GroupLayout& L = a.layout;
  if (L.num_blocks < 1) return "layout.num_blocks must be >= 1";
  if (a.m % L.num_blocks != 0) return "M must be a multiple of layout.num_blocks";
  if (L.num_groups < 1 || L.num_groups > kMaxGroups)
    return "layout.num_groups must be in [1, " + std::to_string(kMaxGroups) + "]";
  const int64_t rows = a.m / L.num_blocks;
  if (L.band_rows[0] != 0) return "layout.band_rows[0] must be 0";
  for (int g = 0; g < L.num_groups; ++g) {
    if (L.band_rows[g + 1] <= L.band_rows[g])
      return "layout.band_rows must be strictly increasing (band " + std::to_string(g) + " is empty)";
  }
  if (L.band_rows[L.num_groups] != rows)
    return "layout.band_rows[num_groups] must equal M / num_blocks = " + std::to_string(rows);
  return "";
}

// The extensions of signaling_gemm.h (row rotation, column-blocked output, input flags).
std::string ValidateExtensions(const SignalingGemmArgs& a) {
  const GroupLayout& L = a.layout;
  auto is_band_boundary = [&](int64_t row) {
    for (int g = 0; g <= L.num_groups; ++g) {
      if (L.band_rows[g] == row) return true;
    }
    return false;
  };
  if (a.row_rotation < 0 || a.row_rotation >= a.m)
    return "row_rotation must be in [0, M), got " + std::to_string(a.row_rotation);
  if (a.row_rotation != 0) {
    if (L.num_blocks != 1) return "row_rotation needs layout.num_blocks == 1";
    if (!is_band_boundary(a.m - a.row_rotation))
      return "M - row_rotation = " + std::to_string(a.m - a.row_rotation) +
             " must be a band boundary (no tile may wrap around)";
  }
  if (a.out_col_block != 0) {
    if (a.out_col_block < 8 || a.out_col_block % 8 != 0 || a.n % a.out_col_block != 0)
      return "out_col_block must be a positive multiple of 8 dividing N=" + std::to_string(a.n) +
             ", got " + std::to_string(a.out_col_block);
  }
  if (a.in_flags != nullptr) {
    if ((reinterpret_cast<uintptr_t>(a.in_flags) & 3) != 0) return "in_flags must be 4-byte aligned";
    if (L.num_blocks != 1) return "in_flags needs layout.num_blocks == 1";
    const int64_t f = a.in_flag_rows;
    if (f < 1 || a.m % f != 0)
      return "in_flag_rows must be >= 1 and divide M=" + std::to_string(a.m) + ", got " +
             std::to_string(f);
    if (a.row_rotation % f != 0) return "row_rotation must be a multiple of in_flag_rows";
    for (int64_t row = f; row < a.m; row += f) {
      if (!is_band_boundary(row))
        return "every multiple of in_flag_rows must be a band boundary; " + std::to_string(row) +
               " is not";
    }
  }
  return "";
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The reduction in the epilogue and the mirror stores (signaling_gemm.h).
std::string ValidateEpiloguePeers(const SignalingGemmArgs& a) {
  if (a.add_from == nullptr) {
    if (a.add_sources != 0 || a.add_counters != nullptr)
      return "add_sources / add_counters given without add_from";
  } else {
    if (!Aligned16(a.add_from)) return "add_from must be 16-byte aligned";
    if (a.add_sources < 1 || a.add_sources > kMaxAddSources)
      return "add_sources must be in [1, " + std::to_string(kMaxAddSources) + "], got " +
             std::to_string(a.add_sources);
    if (a.add_stride % 16 != 0)
      return "add_stride must be a multiple of 16 bytes, got " + std::to_string(a.add_stride);
    if (a.add_sources > 1 && a.add_stride == 0) return "add_stride must be non-zero for several sources";
    if (a.add_counters != nullptr && (reinterpret_cast<uintptr_t>(a.add_counters) & 3) != 0)
      return "add_counters must be 4-byte aligned";
  }
  if (a.mirror_count < 0 || a.mirror_count > kMaxAddSources)
    return "mirror_count must be in [0, " + std::to_string(kMaxAddSources) + "], got " +
           std::to_string(a.mirror_count);
  if (a.mirror_count == 0 && a.mirror_offset != 0) return "mirror_offset given without mirror_slots";
  for (int i = 0; i < a.mirror_count; ++i) {
    if (a.mirror_slots[i] == nullptr || (reinterpret_cast<uintptr_t>(a.mirror_slots[i]) & 7) != 0)
      return "mirror_slots[" + std::to_string(i) + "] must be set and 8-byte aligned";
  }
  if (a.mirror_count > 1 && a.out_col_block != 0)
    return "several mirrors (mirror_count " + std::to_string(a.mirror_count) +
           ") need out row-major (out_col_block 0): they are stored a row at a time";
  if (a.mirror_offset % 16 != 0)
    return "mirror_offset must be a multiple of 16 bytes, got " + std::to_string(a.mirror_offset);
  if (a.head_groups < 0 || a.head_groups > a.layout.num_groups)
    return "head_groups must be in [0, num_groups], got " + std::to_string(a.head_groups);
  if (a.head_groups > 0) {
    if (a.head_dests < 1 || a.head_dests > kMaxAddSources || a.head_groups % a.head_dests != 0)
      return "head_dests must be in [1, " + std::to_string(kMaxAddSources) + "] and divide head_groups (" +
             std::to_string(a.head_groups) + "), got " + std::to_string(a.head_dests);
    for (int d = 0; d < a.head_dests; ++d) {
      if (a.head_out[d] == nullptr || !Aligned16(a.head_out[d]))
        return "head_out[" + std::to_string(d) + "] must be set and 16-byte aligned";
      if ((reinterpret_cast<uintptr_t>(a.head_counters[d]) & 3) != 0)
        return "head_counters[" + std::to_string(d) + "] must be 4-byte aligned";
    }
  }
  if (a.head_add_dests != 0) {
    if (a.head_groups == 0 || a.head_add_dests < 0 || a.head_add_dests > a.head_dests)
      return "head_add_dests must be in [0, head_dests (" + std::to_string(a.head_groups > 0 ? a.head_dests : 0) +
             ")], got " + std::to_string(a.head_add_dests);
    if (a.add_from == nullptr || a.add_sources != 1 || a.add_counters == nullptr)
      return "head_add_dests needs add_from with add_sources 1 and add_counters (the head groups' "
             "counters are add_counters[g - head_groups])";
  }
  return "";
}

// FLASHOVERLAP_GEMM_LOG=1: one line on stderr per distinct launch geometry (diagnosis: what
// grid a process really gets, e.g. under JAX vs a standalone program).
void LogGeometry(const SignalingGemmArgs& args, const GemmTileShape& ts, const TileSchedule& s,
                 int device, int max_clusters, int clusters, int stages) {
  static std::mutex mu;
  static std::set<std::tuple<int64_t, int64_t, int64_t, int, int, int, bool, bool, int>> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert({args.m, args.n, args.k, args.comm_sms, clusters, device, args.queue != nullptr,
                   args.transpose_w, stages}).second)
    return;
  char split[160] = "whole units";
  if (s.split_units > 0)
    std::snprintf(split, sizeof split, "split tail: last %d units in %d chunks of %d K tiles (%.2f waves)",
                  s.split_units, s.split_chunks, s.split_len,
                  double(s.num_units - s.split_units) / clusters + double(s.split_len) / s.k_tiles);
  // The stages tell the instances apart where the tile does not: at 128x256 3 for the
  // whole-tile overlapped epilogue, 4 for the sync one or the one staged in halves.
  std::fprintf(stderr,
               "[flashoverlap gemm] device %d M=%lld N=%lld K=%lld comm_sms=%d tile %dx%d cluster %d, %d stages: "
               "w %s, %d units, grid %d clusters (occupancy allows %d), %d waves, %d groups, %s tile order, %s\n",
               device, (long long)args.m, (long long)args.n, (long long)args.k, args.comm_sms, ts.block_m,
               ts.block_n, ts.cluster_m, stages, args.transpose_w ? "[N,K]" : "[K,N]", s.num_units, clusters, max_clusters,
               (s.num_units + clusters - 1) / clusters, s.num_groups,
               args.queue != nullptr ? "dynamic" : "round-robin", split);
}

}  // namespace

const char* LastSignalingGemmError() { return g_last_error.c_str(); }

GemmLaunchInfo LastSignalingGemmLaunch() { return g_last_launch; }

GemmTileShape ChooseTileShape(const SignalingGemmArgs& args) {
  // 128x256 tiles (2x1 clusters multicasting w) are the fastest per flop; use them once
  // there is at least one full wave of them, else 128x128 tiles (no cluster: small-M
  // problems would leave half of each cluster idle). FLASHOVERLAP_GEMM_TILE=128 or 256
  // forces a shape (tests). FLASHOVERLAP_GEMM_SCHEDULE=pingpong: the ping-pong kernel's
  // 128x128 tiles in 2x1 clusters in place of the 128x256 ones ([K, N] weights only).
  bool pingpong = false;
  GemmTileShape wide{128, 256, 2};
  if (ReadSwitch(kScheduleSwitch, &pingpong).empty() && pingpong && !args.transpose_w)
    wide = GemmTileShape{128, 128, 2};
  GemmTileShape narrow{128, 128, 1};
  const int forced = EnvInt("FLASHOVERLAP_GEMM_TILE", 0);  // other values: PlanLaunch refuses
  if (forced == 256) return wide;
  if (forced == 128) return narrow;
  int device = 0;
  DeviceInfo info;
  int sms = 132;  // H100/H200 SXM; only used if the query fails (launch reports that error)
  if (GetDeviceInfo(&device, &info) == cudaSuccess) sms = info.sms;
  const int64_t usable = sms - (args.comm_sms > 0 ? args.comm_sms : 0);
  const int64_t wide_tiles = CeilDiv64(args.m, 128) * CeilDiv64(args.n, 256);
  return wide_tiles >= usable ? wide : narrow;
}

int64_t TilesInGroup(const SignalingGemmArgs& args, int group) {
  const GroupLayout& L = args.layout;
  if (group < 0 || group >= L.num_groups) return 0;
  const GemmTileShape ts = ChooseTileShape(args);
  const int64_t h = L.band_rows[group + 1] - L.band_rows[group];
  return int64_t(L.num_blocks) * CeilDiv64(h, ts.block_m) * CeilDiv64(args.n, ts.block_n);
}

namespace {

// Everything a launch of these args decides before it launches: the instance, the schedule
// (with the split tail), the main grid and the helpers' grid. Deterministic in the args and
// the environment, so a helper launch plans exactly as its main launch did.
struct LaunchPlan {
  const InstanceOps* ops = nullptr;
  GemmTileShape tile;
  TileSchedule schedule;
  SignalingGemmArgs args;  // queue null where the round robin is used
  int device = 0, max_clusters = 0, clusters = 0, helper_clusters = 0;
};

// Helper launches' rings carry sequence numbers in 25 bits (work_units.cuh, Tag).
constexpr int kHelperMaxUnits = 1 << 25;

cudaError_t PlanLaunch(const SignalingGemmArgs& args, LaunchPlan* plan) {
  // --- arguments ---
  if (args.dtype != GemmDType::kBFloat16 && args.dtype != GemmDType::kFloat16)
    return Fail(cudaErrorInvalidValue, "dtype must be bf16 or f16");
  if (args.m < 1) return Fail(cudaErrorInvalidValue, "M must be >= 1");
  if (args.n < 8 || args.n % 8 != 0 || args.k < 8 || args.k % 8 != 0)
    return Fail(cudaErrorInvalidValue, "N and K must be positive multiples of 8 (16-byte rows for TMA), got N=" +
                                           std::to_string(args.n) + " K=" + std::to_string(args.k));
  // 32-bit TMA coordinates and int row arithmetic in the kernel.
  if (args.m >= (int64_t(1) << 30) || args.n >= (int64_t(1) << 30) || args.k >= (int64_t(1) << 30))
    return Fail(cudaErrorInvalidValue, "M, N and K must be < 2^30");
  if (args.x == nullptr || args.w == nullptr || args.out == nullptr)
    return Fail(cudaErrorInvalidValue, "x, w and out must be non-null");
  if (!Aligned16(args.x) || !Aligned16(args.w) || !Aligned16(args.out))
    return Fail(cudaErrorInvalidValue, "x, w and out must be 16-byte aligned (TMA and vector stores)");
  if (args.counters != nullptr && (reinterpret_cast<uintptr_t>(args.counters) & 3) != 0)
    return Fail(cudaErrorInvalidValue, "counters must be 4-byte aligned");
  const std::string layout_error = ValidateLayout(args);
  if (!layout_error.empty()) return Fail(cudaErrorInvalidValue, layout_error);
  const std::string ext_error = ValidateExtensions(args);
  if (!ext_error.empty()) return Fail(cudaErrorInvalidValue, ext_error);
  const std::string peers_error = ValidateEpiloguePeers(args);
  if (!peers_error.empty()) return Fail(cudaErrorInvalidValue, peers_error);

  // --- device ---
  int device = 0;
  DeviceInfo info;
  cudaError_t e = GetDeviceInfo(&device, &info);
  if (e != cudaSuccess) return Fail(e, std::string("device query failed: ") + cudaGetErrorString(e));
  if (info.major != 9 || info.minor != 0)
    return Fail(cudaErrorNotSupported, "the signaling GEMM needs an sm_90 GPU (H100/H200); this device is sm_" +
                                           std::to_string(info.major * 10 + info.minor));
  if (args.comm_sms < 0 || args.comm_sms >= info.sms)
    return Fail(cudaErrorInvalidValue, "comm_sms must be in [0, " + std::to_string(info.sms) + ")");

  // (the schedule switch is only validated here: ChooseTileShape acts on it)
  Epilogue epilogue = Epilogue::kOverlap;
  bool static_queue = false, whole_tail = false, pingpong = false;
  for (const std::string& error : {ReadEpilogue(&epilogue),
                                   ReadSwitch(kQueueSwitch, &static_queue),
                                   ReadSwitch(kTailSwitch, &whole_tail),
                                   ReadSwitch(kScheduleSwitch, &pingpong)}) {
    if (!error.empty()) return Fail(cudaErrorInvalidValue, error);
  }
  // The integer variables, as _ext.check_kernel_integers accepts them (read at every launch:
  // set after lowering, or in a C++ harness, a typo must not silently pick another setting).
  // TILE's own message for every refusal ("an integer in [0, 256]" said 200 would do).
  std::string env_error;
  const int tile = EnvInt("FLASHOVERLAP_GEMM_TILE", 0, 0, 256, &env_error);
  if (!env_error.empty() || (tile != 0 && tile != 128 && tile != 256))
    env_error = std::string("FLASHOVERLAP_GEMM_TILE='") + std::getenv("FLASHOVERLAP_GEMM_TILE") +
                "' must be 0, 128 or 256";
  const int panel = EnvInt("FLASHOVERLAP_GEMM_PANEL", 8, 1, 1024, &env_error);
  const bool serpentine = EnvInt("FLASHOVERLAP_GEMM_SERPENTINE", 1, 0, 1, &env_error) != 0;
  EnvInt("FLASHOVERLAP_GEMM_LOG", 0, 0, 1, &env_error);
  if (!env_error.empty()) return Fail(cudaErrorInvalidValue, env_error);
  if (args.queue != nullptr && (reinterpret_cast<uintptr_t>(args.queue) & 15) != 0)
    return Fail(cudaErrorInvalidValue, "queue must be 16-byte aligned");
  const GemmTileShape ts = ChooseTileShape(args);
  const bool adds = args.add_from != nullptr || args.mirror_count > 0 || args.head_groups > 0;
  const InstanceOps& ops = PickInstance(args.dtype, ts, epilogue, args.transpose_w, args.mirror_count > 1, adds);
  if (adds && !ops.epilogue_adds)
    return Fail(cudaErrorInvalidValue,
                "add_from / mirror_slots / head_groups need the overlapped epilogue; FLASHOVERLAP_GEMM_EPILOGUE=sync is set");
  int max_clusters = 0;
  e = ops.prepare(device, &max_clusters);
  if (e != cudaSuccess) return Fail(e, std::string("kernel setup failed: ") + cudaGetErrorString(e));

  // --- schedule ---
  TileSchedule& s = plan->schedule;
  s = TileSchedule{};
  s.m = int(args.m);
  s.n = int(args.n);
  s.num_blocks = args.layout.num_blocks;
  s.num_groups = args.layout.num_groups;
  s.rows_per_block = int(args.m / args.layout.num_blocks);
  s.block_m = ts.block_m;
  s.block_n = ts.block_n;
  s.cluster_m = ts.cluster_m;
  s.n_tiles = int(CeilDiv64(args.n, ts.block_n));
  // 8 cluster rows x ~8 column tiles per wave of ~66 units: about square, see tile_schedule.h.
  s.panel = panel;
  s.serpentine = serpentine;
  for (int g = 0; g <= s.num_groups; ++g) s.band_rows[g] = args.layout.band_rows[g];
  s.row_rotation = args.row_rotation;
  s.k_tiles = int(CeilDiv64(args.k, kGemmBlockK));
  if (!CountUnits(s)) return Fail(cudaErrorInvalidValue, "too many tiles");

  // Persistent grid: one cluster per unit at most, never more than fit at once, and
  // comm_sms multiprocessors left for the collective (whole clusters only).
  const int allowed = (info.sms - args.comm_sms) / ts.cluster_m;
  if (allowed < 1) return Fail(cudaErrorInvalidValue, "comm_sms leaves no room for one cluster");
  int clusters = allowed < max_clusters ? allowed : max_clusters;
  if (clusters > s.num_units) clusters = s.num_units;

  plan->args = args;
  if (static_queue || clusters > kQueueMaxClusters) plan->args.queue = nullptr;
  if (plan->args.queue != nullptr && !whole_tail) PlanSplitTail(s, clusters, ops.max_split_slots);
  // Helpers: the clusters comm_sms leaves room for, only with the queue (they claim from it).
  int helpers = 0;
  if (args.helpers && plan->args.queue != nullptr && s.num_units < kHelperMaxUnits) {
    helpers = MinInt(args.comm_sms / ts.cluster_m, max_clusters - clusters);
    helpers = MinInt(helpers, kQueueMaxClusters - clusters);
    if (helpers < 0) helpers = 0;
  }
  plan->ops = &ops;
  plan->tile = ts;
  plan->device = device;
  plan->max_clusters = max_clusters;
  plan->clusters = clusters;
  plan->helper_clusters = helpers;
  return cudaSuccess;
}

}  // namespace

cudaError_t PrepareSignalingGemms(int device) {
  using Getter = const InstanceOps& (*)();
  static constexpr Getter kAll[] = {
      SignalingGemmBf16Tile128x256Overlap, SignalingGemmBf16Tile128x128Overlap,
      SignalingGemmF16Tile128x256Overlap, SignalingGemmF16Tile128x128Overlap,
      SignalingGemmBf16Tile128x256, SignalingGemmBf16Tile128x128,
      SignalingGemmF16Tile128x256, SignalingGemmF16Tile128x128,
      SignalingGemmBf16Tile128x128PingPong, SignalingGemmF16Tile128x128PingPong,
      SignalingGemmBf16Tile128x256OverlapNK, SignalingGemmBf16Tile128x128OverlapNK,
      SignalingGemmF16Tile128x256OverlapNK, SignalingGemmF16Tile128x128OverlapNK,
      SignalingGemmBf16Tile128x256OverlapPeer, SignalingGemmF16Tile128x256OverlapPeer,
      SignalingGemmBf16Tile128x256OverlapNKPeer, SignalingGemmF16Tile128x256OverlapNKPeer,
      SignalingGemmBf16Tile128x256Halves, SignalingGemmF16Tile128x256Halves,
      SignalingGemmBf16Tile128x256HalvesNK, SignalingGemmF16Tile128x256HalvesNK};
  for (Getter get : kAll) {
    int clusters = 0;
    const cudaError_t e = get().prepare(device, &clusters);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchSignalingGemm(const SignalingGemmArgs& args, cudaStream_t stream) {
  LaunchPlan plan;
  cudaError_t e = PlanLaunch(args, &plan);
  if (e != cudaSuccess) return e;
  const TileSchedule& s = plan.schedule;
  if (plan.args.queue != nullptr) {  // the claim counter, the split flags, the used rings
    const size_t rings = size_t(plan.clusters + plan.helper_clusters) * kQueueRingSlots * 8;
    e = cudaMemsetAsync(plan.args.queue, 0, kQueueRingOffset + rings, stream);
    if (e != cudaSuccess) return Fail(e, std::string("tile queue reset failed: ") + cudaGetErrorString(e));
  }
  if (args.queue_reset != nullptr) {
    e = cudaEventRecord(args.queue_reset, stream);
    if (e != cudaSuccess) return Fail(e, std::string("queue_reset event record failed: ") + cudaGetErrorString(e));
  }
  if (EnvInt("FLASHOVERLAP_GEMM_LOG", 0) != 0)
    LogGeometry(plan.args, plan.tile, s, plan.device, plan.max_clusters, plan.clusters, plan.ops->stages);
  e = plan.ops->launch(plan.args, s, plan.clusters, QueueRole{}, stream);
  if (e != cudaSuccess) return Fail(e, std::string("kernel launch failed: ") + cudaGetErrorString(e));
  g_last_launch = GemmLaunchInfo{plan.clusters, s.num_units, s.split_units, s.split_chunks,
                                 plan.helper_clusters};
  return cudaSuccess;
}

cudaError_t LaunchSignalingGemmHelpers(const SignalingGemmArgs& args, int until_group,
                                       cudaStream_t stream) {
  if (!args.helpers) return Fail(cudaErrorInvalidValue, "a helper launch needs args.helpers");
  if (until_group < 0 || until_group >= args.layout.num_groups)
    return Fail(cudaErrorInvalidValue, "until_group must be in [0, num_groups), got " +
                                           std::to_string(until_group));
  LaunchPlan plan;
  cudaError_t e = PlanLaunch(args, &plan);
  if (e != cudaSuccess) return e;
  if (plan.helper_clusters == 0) return cudaSuccess;
  const TileSchedule& s = plan.schedule;
  // Whole units of groups <= until_group; the split tail's chunks are the main grid's (its
  // plan counts on each of its clusters taking one).
  const int limit = MinInt(s.unit_start[until_group + 1], s.num_units - s.split_units);
  if (limit <= 0) return cudaSuccess;
  QueueRole role;
  role.claim_limit = unsigned(limit);
  role.ring_base = plan.clusters;
  role.ring_epoch = until_group + 1;  // <= kMaxGroups < 2^7 (work_units.cuh, Tag)
  e = plan.ops->launch(plan.args, s, plan.helper_clusters, role, stream);
  if (e != cudaSuccess) return Fail(e, std::string("helper kernel launch failed: ") + cudaGetErrorString(e));
  return cudaSuccess;
}

}  // namespace flashoverlap
