// Signaling GEMM: out = x @ w (fp32 accumulation) on sm_90a, and after each output tile
// is stored and globally visible, one atomicAdd on the counter of the tile's
// communication group. Framework-free: no XLA or Python headers here.
//
// Group layout (DESIGN.md, "Groups that need no reordering pass"):
//   The M rows are split into `num_blocks` equal rank blocks (1 for a plain GEMM or an
//   all-reduce, the world size for a reduce-scatter), each of rows_per_block = M / num_blocks
//   rows. Inside every block, rows [band_rows[g], band_rows[g+1]) form band g. Group g is
//   band g of every block. Its tiles are written to one contiguous span of `out`:
//
//     group g occupies rows [num_blocks * band_rows[g], num_blocks * band_rows[g+1]) of out;
//     source row  j * rows_per_block + o  (block j, o in band g)  is stored at out row
//     num_blocks * band_rows[g] + j * (band_rows[g+1] - band_rows[g]) + (o - band_rows[g]).
//
//   With num_blocks == 1 this is the identity (row-major [M, N]). With num_blocks == n,
//   ncclReduceScatter(out + num_blocks*band_rows[g]*N, recv + band_rows[g]*N,
//   (band_rows[g+1]-band_rows[g])*N) lands rank r's band at its place in a contiguous
//   [M/n, N] result.
//
//   Tiles never straddle a band or a block (each band is tiled on its own), so every tile
//   belongs to exactly one group. Groups are scheduled in order: all tiles of group g are
//   handed out before any tile of group g+1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashoverlap {

enum class GemmDType : int { kBFloat16 = 0, kFloat16 = 1 };

constexpr int kMaxGroups = 64;
// Partial-sum sources of the reduction in the epilogue (SignalingGemmArgs::add_from): the
// peers of one rank on an 8-GPU node.
constexpr int kMaxAddSources = 7;

// The dynamic tile queue's workspace (SignalingGemmArgs::queue), in this order:
//  - a claim counter (uint32), the units helper launches took (uint32, statistics), 8 bytes
//    unused (16 bytes);
//  - the split tail's ready flags (int32, one per partial tile, see below);
//  - per cluster a ring of kQueueRingSlots claimed ids (64-bit, tagged with their sequence
//    number) through which a cluster's leader CTA hands its claims to its partner (the main
//    launch's clusters first, then the helper launches' clusters);
//  - the split tail's partial tiles (fp32 accumulators, kSplitPartialBytes).
// The launcher zeroes everything but the partials before each launch (one memset).
constexpr int kQueueRingSlots = 16;
constexpr int kQueueMaxClusters = 256;
constexpr int kSplitMaxFlags = 512;  // partial tiles (CTAs) of one launch's split tail
constexpr size_t kQueueFlagsOffset = 16;
constexpr size_t kQueueRingOffset = kQueueFlagsOffset + size_t(kSplitMaxFlags) * 4;
constexpr size_t kQueuePartialsOffset =
    (kQueueRingOffset + size_t(kQueueMaxClusters) * kQueueRingSlots * 8 + 255) / 256 * 256;
// Split tail: room for 66 cluster tiles of 2 x 128 x 256 fp32 (one per cluster of a full
// H100/H200 grid), or 264 of the 128 x 128 tile.
constexpr size_t kSplitPartialBytes = size_t(66) * 2 * 128 * 256 * 4;
constexpr size_t kGemmQueueBytes = kQueuePartialsOffset + kSplitPartialBytes;

struct GroupLayout {
  int num_blocks = 1;   // rank blocks; M % num_blocks == 0
  int num_groups = 1;   // 1 <= num_groups <= kMaxGroups
  // band_rows[0] == 0 < band_rows[1] < ... < band_rows[num_groups] == M / num_blocks.
  int band_rows[kMaxGroups + 1] = {0};
};

struct SignalingGemmArgs {
  const void* x = nullptr;  // [M, K] row-major
  const void* w = nullptr;  // [K, N] row-major, or [N, K] row-major with transpose_w
  // w given as [N, K] (e.g. an [out, in] weight, or the backward's w^T): out = x @ w^T, w read
  // in place by K-major loads (no transpose pass). The comparison switches
  // FLASHOVERLAP_GEMM_EPILOGUE=sync / FLASHOVERLAP_GEMM_SCHEDULE=pingpong apply to [K, N] only.
  bool transpose_w = false;
  void* out = nullptr;      // [M, N] in the group layout above, dtype of x
  int64_t m = 0, n = 0, k = 0;  // N and K multiples of 8, M >= 1
  GemmDType dtype = GemmDType::kBFloat16;
  // Device array of layout.num_groups int32 counters, zeroed by the caller before the
  // launch; counter[g] reaches TilesInGroup(g) once group g is complete and visible.
  // May be null: then no signal is sent.
  int32_t* counters = nullptr;
  int comm_sms = 0;  // SMs left free for communication: persistent grid = SMs - comm_sms
  GroupLayout layout;
  // Dynamic tile queue: device memory of kGemmQueueBytes (any content; the launcher zeroes
  // it on `stream` before the kernel), owned by the caller and used by one launch at a time.
  // With it, clusters take the next work unit from an atomic counter instead of a fixed
  // round-robin share, so a cluster that starts late (SMs still held by another stream's
  // kernels) takes fewer units instead of delaying the end by its whole share. Null: the
  // fixed round-robin order. FLASHOVERLAP_GEMM_QUEUE=static forces the fixed order.
  //
  // Split tail (only with the queue): when the units do not fill the grid's last wave, the
  // last wave and the one before it are cut along K into one equal chunk per cluster (a
  // cluster tile split between two chunks: the earlier chunk leaves its fp32 partial sum in
  // the queue workspace, the later one adds it and stores the tile), so the GEMM takes
  // ~units/clusters unit times instead of ceil(units/clusters). FLASHOVERLAP_GEMM_TAIL=whole
  // keeps whole units (SplitTailPlan in tile_schedule.h says when the launcher splits).
  void* queue = nullptr;

  // ---- Extensions (issue #9); the defaults keep the behaviour above. ----
  // Row rotation: schedule row o (the rows the group layout talks about) is row
  // (o + row_rotation) % M of x and of out, so the first groups cover rows starting at
  // row_rotation (e.g. the local rank's block first). Needs num_blocks == 1 and, when
  // non-zero, M - row_rotation must be a band boundary (no tile wraps around).
  int row_rotation = 0;
  // Column-blocked output: 0 = out row-major [M, N]; c > 0 = out is [N/c, M, c], column
  // block j (columns [j*c, (j+1)*c)) stored contiguously. c a multiple of 8 dividing N.
  int out_col_block = 0;
  // Input readiness flags: when non-null, before loading a tile's rows of x the producer
  // waits (ld.acquire.gpu spin, then fence.proxy.async) until
  // in_flags[x_row / in_flag_rows] == in_flag_value. Needs num_blocks == 1, M a multiple
  // of in_flag_rows, row_rotation a multiple of it, and every flag-block boundary a band
  // boundary (in schedule rows), so no tile spans two flag blocks. The flags must be made
  // ready by other streams while the kernel runs: leave comm_sms >= 1 for their work.
  const int32_t* in_flags = nullptr;
  int in_flag_rows = 0;
  int32_t in_flag_value = 0;

  // ---- Reduction in the epilogue and stores to a peer (docs/DESIGN.md, "Peer stores") ----
  // Partial sums that other ranks computed for the same output rows, added as each tile is
  // stored: when add_from is non-null, every stored element is
  //   round(float(round(acc)) + sum over s < add_sources of float(add_from_s[e]))
  // where add_from_s = add_from + s * add_stride bytes, each laid out like `out` (the element
  // at the same offset as its destination). For one source this is, bit for bit, what NCCL's
  // sum of the two rounded partials gives. add_counters[s * num_groups + g] (with head groups:
  // [s * (num_groups - head_groups) + g - head_groups]) counts the tiles of group g that
  // source s has stored (the source's own launch, with this launch's layout
  // and tile shape, signalling into it): before reading a tile's partials the storing threads
  // wait until it reaches TilesInGroup(g) (acquire, system scope: another GPU may have
  // written counter and data). Null add_counters: the partials are ready before the launch.
  // Whoever writes them must not need this launch's SMs (another GPU, a copy engine, or
  // leave comm_sms >= 1). Overlapped-epilogue instances only (FLASHOVERLAP_GEMM_EPILOGUE=sync
  // is refused).
  const void* add_from = nullptr;
  int64_t add_stride = 0;  // bytes, a multiple of 16
  int add_sources = 0;     // 1 .. kMaxAddSources
  const int32_t* add_counters = nullptr;
  // Tests only (the A/B of the 128x256 instances' add ring, signaling_gemm_config.cuh): load
  // the partials one 16-byte chunk at a time, as the 128x128 instances and several sources
  // always do. Same results bit for bit.
  bool add_serial = false;
  // Counters in another GPU's memory (out, too, may be there): fence at system scope, not
  // GPU scope, before each signal, so the tile's stores are visible to that GPU first.
  bool signal_system = false;
  // Mirror stores: every stored chunk is stored again at P_i + mirror_offset + (its offset in
  // out) for each i < mirror_count, where P_i is the device pointer in mirror_slots[i][0..1]
  // (e.g. a peer's output of this very call, posted there by that peer): the storing threads
  // wait (acquire, system scope) until mirror_slots[i][2] == mirror_call, the stamp its
  // writer sets after the pointer. 0: no second store. Several mirrors (a group of 3 or more),
  // on tiles that add through the add ring (128 x 256), are stored a whole tile row at a
  // time by bulk copies from shared memory (cp.async.bulk) rather than per 16-byte chunk:
  // out must then be row-major (out_col_block 0; refused otherwise).
  const int32_t* mirror_slots[kMaxAddSources] = {};  // each 8-byte aligned: {low, high, stamp}
  int mirror_count = 0;
  int64_t mirror_offset = 0;  // bytes, a multiple of 16
  int32_t mirror_call = 0;
  // Head groups: groups g < head_groups are stored elsewhere, in head_dests destinations of
  // head_groups / head_dests groups each: group g goes to destination d = g / (head_groups /
  // head_dests), into head_out[d] (laid out like out: the element at the same offset), and is
  // counted in head_counters[d][g - d * (head_groups / head_dests)] with a system-scope fence
  // (e.g. each peer's share of a reduce-scatter, stored into that peer's memory); they are
  // never mirrored. The other groups are numbered from head_groups on where they index
  // add_counters and counters (group g uses [g - head_groups]), so they line up with the
  // peers' head groups of the same bands. head_groups 0: none.
  int head_groups = 0;
  int head_dests = 1;  // 1 .. kMaxAddSources, dividing head_groups
  void* head_out[kMaxAddSources] = {};
  int32_t* head_counters[kMaxAddSources] = {};
  // Head destinations that add (a reduction passed along a ring of ranks, docs/DESIGN.md
  // "Ring reduction"): the last head_add_dests destinations' groups add add_from's partial
  // sums (one source, at the same offsets as the rest) before they are stored, exactly as the
  // other groups do, and wait for add_counters[g - head_groups]: a negative index, so the
  // caller places add_counters where those land on its counters of the head groups'
  // partials. 0 (default): head groups are stored as computed. Needs add_from with
  // add_sources == 1 and add_counters.
  int head_add_dests = 0;
  // The waits for another GPU's stores (add_counters, mirror_slots) give up when
  // *abort_flag != 0 (a watchdog's host-mapped flag, read every kAbortCheckSpins spins): the
  // kernel traps, as the spin-wait kernel does; the CUDA context is then unusable (the
  // process must restart, which a peer that never comes required anyway). Null: wait for ever.
  const volatile int* abort_flag = nullptr;
  // The same waits also end, without a trap, once *peer_failed != 0 (in this GPU's memory, set
  // by a stream write of whichever rank of a peer-store group failed: EnqueueBreakPeers): the
  // partials are then added as they are and nothing more is mirrored. The results are wrong,
  // which the failed call's error reports; the GPU stays usable. Null: no such word.
  const int32_t* peer_failed = nullptr;

  // ---- Helper launches (LaunchSignalingGemmHelpers); needs the queue. ----
  // The SMs left to communication (comm_sms) sit idle between two collectives. With helpers,
  // the caller launches small grids on those SMs, on its communication stream between its
  // collectives, that take units from this launch's queue until a group's last unit is
  // claimed and then exit, so the next collective finds its SMs free (stream order). This
  // flag makes the main launch plan for them (reset their rings with the queue); the
  // helpers' grid is what comm_sms leaves (GemmLaunchInfo::helper_clusters, 0: none).
  bool helpers = false;
  // Recorded on `stream` right after the queue reset, before the kernel (null: none): a
  // helper launched on another stream must wait for it.
  cudaEvent_t queue_reset = nullptr;
#ifdef FO_TIMELINE
  // Test builds only (tests/cuda/build_timeline.sh, every object compiled with FO_TIMELINE):
  // clock64() stamps of the first kTimelineCtas CTAs' warps, laid out
  // [cta][role][piece][event] (roles: consumer, producer, copy-out). Null: none recorded.
  long long* timeline = nullptr;
#endif
};
#ifdef FO_TIMELINE
constexpr int kTimelineCtas = 8, kTimelineRoles = 3, kTimelinePieces = 48, kTimelineEvents = 8;
#endif

// Tile shape the launcher picks for these args (host-side, deterministic for a given
// device type and args). cluster_m CTAs along M form one thread-block cluster that
// shares (multicasts) the w tile; a band whose height is not a multiple of
// block_m * cluster_m leaves one idle CTA per cluster row at its end, so callers that
// choose band_rows should prefer multiples of row_align = block_m * cluster_m.
struct GemmTileShape {
  int block_m = 0;
  int block_n = 0;
  int cluster_m = 1;   // extension: CTAs per cluster along M (1 or 2)
  int row_align() const { return block_m * cluster_m; }
};
GemmTileShape ChooseTileShape(const SignalingGemmArgs& args);

// Number of tiles of group g, i.e. the value counter[g] reaches (host-side).
int64_t TilesInGroup(const SignalingGemmArgs& args, int group);

// Checks args (shapes, layout, alignment) and launches on `stream`. Returns
// cudaErrorInvalidValue for bad args (message through LastSignalingGemmError()),
// cudaErrorNotSupported below sm_90, or the launch error.
cudaError_t LaunchSignalingGemm(const SignalingGemmArgs& args, cudaStream_t stream);

// A helper launch for the main launch made with the same args (args.helpers set): on `stream`
// (ordered after args.queue_reset of that launch, and after the collectives whose SMs it
// borrows), GemmLaunchInfo::helper_clusters clusters that take whole units from the main
// launch's queue while the claim counter is below the end of group `until_group` (never the
// split tail's chunks), then exit. Launches nothing (cudaSuccess) where the main launch has
// no helpers (no room, no queue, FLASHOVERLAP_GEMM_QUEUE=static, 2^25 units or more) or no unit
// is left below that end. Same errors as LaunchSignalingGemm.
cudaError_t LaunchSignalingGemmHelpers(const SignalingGemmArgs& args, int until_group,
                                       cudaStream_t stream);

// Every kernel instance's one-time setup on the current device (`device`: its ordinal) now:
// the shared-memory opt-in and the occupancy query, which under CUDA's lazy loading also
// load the instance's module. A module load waits for the kernels running on the device, so
// a first launch behind a wait that never ends (a peer that never comes) would block the
// host thread inside the launch, where the watchdog never learns of the call. Communicators
// call it when they are made (as they load their wait kernels).
cudaError_t PrepareSignalingGemms(int device);

// Human-readable reason for the last cudaErrorInvalidValue / NotSupported returned by
// LaunchSignalingGemm on this host thread.
const char* LastSignalingGemmError();

// What the last successful LaunchSignalingGemm on this host thread launched (tests, logs).
struct GemmLaunchInfo {
  int clusters = 0;      // persistent grid, in clusters
  int units = 0;         // work units (cluster tiles)
  int split_units = 0;   // units in the split tail (0: whole units only)
  int split_chunks = 0;  // chunks they were cut into
  int helper_clusters = 0;  // each helper launch's grid (args.helpers), 0: none
};
GemmLaunchInfo LastSignalingGemmLaunch();

}  // namespace flashoverlap
