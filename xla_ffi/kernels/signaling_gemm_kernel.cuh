// The signaling GEMM kernel (sm_90a): CUTLASS's TMA + wgmma warp-specialized mainloop
// collective, wrapped in our own persistent kernel layer (tile order from tile_schedule.h,
// the producer warp's loads here, the consumers in signaling_gemm_consumers.cuh: cooperative
// or ping-pong, register->smem->global epilogue with a row remap, one signal per tile).
// Included by exactly one .cu per instantiation (signaling_gemm_<dtype>_<tile>.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "signaling_gemm_config.cuh"
#include "signaling_gemm_consumers.cuh"
#include "signaling_gemm_epilogue.cuh"

namespace flashoverlap {
namespace sg {

using namespace cute;

// Waits until *flag == value (the tile's input rows have arrived), then makes the data
// those rows' writers released visible to this thread's later TMA (async-proxy) loads.
// Every lane of the producer warp waits itself, so whichever lane CUTLASS elects to issue
// the TMA has acquired the flag and fenced the proxies.
__device__ __forceinline__ void WaitInputFlag(const int32_t* flag, int32_t value) {
  int32_t seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
    if (seen == value) break;
    __nanosleep(128);
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
SignalingGemmKernel(const __grid_constant__ typename Cfg::Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Cfg::Pipeline;
  using PipelineState = typename Cfg::PipelineState;
  using X = Underscore;
  constexpr int CM = Cfg::CM;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);

  const int thread_idx = int(threadIdx.x);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp_in_group = cutlass::canonical_warp_idx_sync() % 4;
  const int lane = cutlass::canonical_lane_idx();
  const uint32_t rank_in_cluster = cute::block_rank_in_cluster();
  const int rank_m = int(rank_in_cluster) % CM;
  const int cluster_id = int(blockIdx.x) / CM;
  const TileSchedule& sched = params.sched;

  if (thread_idx == 0) Mainloop::prefetch_tma_descriptors(params.mainloop);

  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  if (warp_group == 0 && warp_in_group != 0) pp.role = Pipeline::ThreadCategory::NonParticipant;
  pp.is_leader = (thread_idx % 128) == 0;
  pp.num_consumers = Cfg::kMmaThreads;
  pp.transaction_bytes = params.mainloop.tma_transaction_bytes;
  Pipeline pipeline(ss.pipeline, pp, typename Cfg::ClusterShape{});

  typename Cfg::UnitPipeline::Params up;
  up.role = (warp_group == 0 && warp_in_group == 0) ? Cfg::UnitPipeline::ThreadCategory::Producer
                                                    : Cfg::UnitPipeline::ThreadCategory::Consumer;
  up.producer_arv_count = 1;
  up.consumer_arv_count = Cfg::kUnitReaderWarps;
  up.initializing_warp = 0;
  typename Cfg::UnitPipeline unit_pipe(ss.unit_pipeline, up);
  if constexpr (Cfg::kOverlapEpilogue) {
    if (thread_idx == 0) {
      for (int wg = 0; wg < (Cfg::kStagedHalves ? 2 : 1); ++wg) {
        ss.staging_full[wg].init(Cfg::kStagedHalves ? 128 : kConsumerThreads);
        ss.staging_empty[wg].init(kCopyOutThreads);
      }
      cutlass::arch::fence_barrier_init();
    }
  }
  if constexpr (Cfg::kPingPong) {
    if (thread_idx == 0) {
      ss.mma_turn[0].init(128);  // every thread of the other warpgroup arrives
      ss.mma_turn[1].init(128);
      cutlass::arch::fence_barrier_init();
    }
  }

  // Barrier initialisation must be visible to every CTA of the cluster before any TMA
  // multicast or remote arrive touches it.
  if constexpr (CM > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  Mainloop mainloop;
  const int M = sched.m, N = sched.n;

  if (warp_group == 0) {
    // Producer warpgroup: one warp issues the TMA loads of every unit this cluster owns.
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (warp_in_group == 0) {
      PipelineState write_state = cutlass::make_producer_start_state<Pipeline>();
      const int k_extent = params.k_tiles * Cfg::BK;
      Tensor mA = params.mainloop.tma_load_a.get_tma_tensor(make_shape(M, k_extent, 1));
      Tensor mB = params.mainloop.tma_load_b.get_tma_tensor(make_shape(N, k_extent, 1));
      Tensor gB_nkl = local_tile(mB, typename Cfg::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
      typename Cfg::UnitState unit_state = cutlass::make_producer_start_state<typename Cfg::UnitPipeline>();
      UnitClaims<Cfg> claims(params, cluster_id, rank_in_cluster);  // used by lane 0 only
      UnitDecoder decoder;
      int np = 0;  // pieces so far (timeline)
      for (int seq = 0;; ++seq) {
        if (lane == 0) FO_STAMP(1, np, 0);
        const int item = ClaimItem<Cfg>(claims, seq, lane);
        if (lane == 0) FO_STAMP(1, np, 1);
        if (item < 0) {
          PublishPiece<Cfg>(unit_pipe, unit_state, ss.pieces, Piece{-1, 0, 0, 0, 0}, TileWork{}, lane);
          break;
        }
        Piece pieces[kMaxPiecesPerItem];
        const int count = ItemPieces(sched, item, pieces);
        for (int i = 0; i < count; ++i) {
          const Piece& piece = pieces[i];
          const TileWork w = decoder.Decode(sched, piece.unit, rank_m);
          if (lane == 0) FO_STAMP(1, np, 4);
          PublishPiece<Cfg>(unit_pipe, unit_state, ss.pieces, piece, w, lane);
          if (lane == 0) FO_STAMP(1, np, 5);
          // Input rows still in flight (all-gather + GEMM): wait for their flag. Idle cluster
          // partners (rows <= 0) load rows that are never stored, so they need not wait.
          if (params.in_flags != nullptr && w.rows > 0) {
            WaitInputFlag(params.in_flags + w.src_row / params.in_flag_rows, params.in_flag_value);
          }
          // Tiles start at arbitrary rows (band and rank-block offsets), so shift the TMA
          // coordinate space to the tile's first row and take tile 0. Rows past M read as
          // zeros (TMA bounds), rows of a neighbouring band are computed but never stored.
          Tensor gA_mkl = local_tile(domain_offset(make_coord(w.src_row, 0, 0), mA),
                                     typename Cfg::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
          auto k_iter = make_coord_iterator(idx2crd(piece.k_begin, shape<3>(gA_mkl)), shape<3>(gA_mkl));
          if (lane == 0) FO_STAMP(1, np, 2);
          mainloop.load(params.mainloop, pipeline, write_state, cute::make_tuple(gA_mkl, gB_nkl),
                        make_coord(0, w.n_tile, _, 0), k_iter, piece.k_count, lane,
                        rank_in_cluster, ss.mainloop);
          write_state.advance(piece.k_count);
          if (lane == 0) FO_STAMP(1, np, 3);
          ++np;
        }
        if (lane == 0) claims.Loaded(seq);
      }
      // Keep this CTA alive until every consumer of the cluster released our stages.
      mainloop.load_tail(pipeline, write_state);
    } else if constexpr (Cfg::kOverlapEpilogue) {
      CopyOutTiles<Cfg>(params, ss.epi, ss.add_ring, unit_pipe, ss.pieces, ss.staging_full,
                        ss.staging_empty, thread_idx - 32);  // [2] each
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<232>();
    if constexpr (Cfg::kPingPong) {
      PingPongConsumer<Cfg>(params, ss, pipeline, unit_pipe, rank_m, thread_idx);
    } else {
      CooperativeConsumer<Cfg>(params, ss, pipeline, unit_pipe, rank_m, thread_idx);
    }
  }
#endif
}

// ---- host side -----------------------------------------------------------------------

static_assert(QueueRole{}.claim_limit == kNoClaimLimit, "the main launch claims without a limit");
static_assert(kMaxGroups < 128, "helper ring epochs (group + 1) take 7 bits (work_units.cuh, Tag)");

template <class Cfg>
struct Instance {
  static constexpr int kSmemBytes = int(sizeof(typename Cfg::SharedStorage));

  // Launch shape of `clusters` clusters of Cfg::CM CTAs (the occupancy query and the launch
  // must describe the same kernel). `attr` must outlive the returned config.
  static cudaLaunchConfig_t LaunchConfig(int clusters, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(clusters * Cfg::CM, 1, 1);
    cfg.blockDim = dim3(Cfg::kThreads, 1, 1);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = stream;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = Cfg::CM;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
  }

  // Per-device one-time setup: opt in to the large smem size, ask the occupancy API how
  // many clusters of this kernel (with its real smem size) can be resident at once.
  static cudaError_t Prepare(int device, int* max_clusters) {
    static std::mutex mu;
    static int cached[kMaxDevices] = {0};
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    std::lock_guard<std::mutex> lock(mu);
    if (cached[device] > 0) {
      *max_clusters = cached[device];
      return cudaSuccess;
    }
    auto kernel = &SignalingGemmKernel<Cfg>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
    if (Cfg::CM > 1) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 0);
      if (e != cudaSuccess) return e;
    }
    int sms = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = LaunchConfig(sms / Cfg::CM, nullptr, &attr);
    int clusters = 0;
    e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e != cudaSuccess) return e;
    if (clusters <= 0) return cudaErrorInvalidConfiguration;
    cached[device] = clusters;
    *max_clusters = clusters;
    return cudaSuccess;
  }

  static cudaError_t Launch(const SignalingGemmArgs& args, const TileSchedule& sched,
                            int num_clusters, const QueueRole& role, cudaStream_t stream) {
    // The launcher plans the split tail (sched.split_*) within our slot capacity, and only
    // with a queue (the partials live in its workspace).
    if (sched.k_tiles != (int(args.k) + Cfg::BK - 1) / Cfg::BK ||
        (sched.split_units > 0 && (args.queue == nullptr || sched.split_chunks - 1 > Cfg::kMaxSplitSlots)))
      return cudaErrorInvalidValue;
    using Element = typename Cfg::Element;
    using Mainloop = typename Cfg::Mainloop;
    const int M = int(args.m), N = int(args.n), K = int(args.k);
    typename Mainloop::Arguments ml_args{
        static_cast<const Element*>(args.x),
        cutlass::make_cute_packed_stride(typename Mainloop::StrideA{}, make_shape(M, K, 1)),
        static_cast<const Element*>(args.w),
        cutlass::make_cute_packed_stride(typename Mainloop::StrideB{}, make_shape(N, K, 1))};
    typename Cfg::Params params;
    // Builds the TMA descriptors (driver entry point reached through the runtime).
    params.mainloop = Mainloop::to_underlying_arguments(make_shape(M, N, K, 1), ml_args, nullptr);
    params.out = args.out;
    params.counters = args.counters;
    params.k_tiles = sched.k_tiles;
    params.num_clusters = num_clusters;
    params.sched = sched;
    params.out_col_block = args.out_col_block;
    params.in_flags = args.in_flags;
    params.in_flag_rows = args.in_flag_rows;
    params.in_flag_value = args.in_flag_value;
    params.add_from = static_cast<const char*>(args.add_from);
    params.add_stride = args.add_stride;
    params.add_sources = args.add_sources;
    params.add_serial = args.add_serial;
    params.add_counters = args.add_counters;
    params.signal_system = args.signal_system;
    params.mirror_count = args.mirror_count;
    params.mirror_offset = args.mirror_offset;
    params.mirror_call = args.mirror_call;
    params.head_groups = args.head_groups;
    params.head_groups_per_dest = args.head_groups > 0 ? args.head_groups / args.head_dests : 1;
    params.add_first_group = args.head_groups - args.head_add_dests * params.head_groups_per_dest;
    for (int i = 0; i < kMaxAddSources; ++i) {
      params.mirror_slots[i] = args.mirror_slots[i];
      params.head_out[i] = static_cast<char*>(args.head_out[i]);
      params.head_counters[i] = args.head_counters[i];
    }
    params.abort_flag = args.abort_flag;
    params.peer_failed = args.peer_failed;
#ifdef FO_TIMELINE
    params.timeline = args.timeline;
#endif
    params.queue_next = static_cast<uint32_t*>(args.queue);
    params.claim_limit = role.claim_limit;
    params.ring_base = role.ring_base;
    params.ring_epoch = role.ring_epoch;
    char* queue = static_cast<char*>(args.queue);
    params.queue_ring = queue == nullptr ? nullptr
        : reinterpret_cast<unsigned long long*>(queue + kQueueRingOffset);
    const bool split = queue != nullptr && sched.split_units > 0;
    params.partials = split ? reinterpret_cast<float*>(queue + kQueuePartialsOffset) : nullptr;
    params.split_flags = split ? reinterpret_cast<int32_t*>(queue + kQueueFlagsOffset) : nullptr;

    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = LaunchConfig(num_clusters, stream, &attr);
    return cudaLaunchKernelEx(&cfg, &SignalingGemmKernel<Cfg>, params);
  }
};

// Defines the InstanceOps getter declared in signaling_gemm_instances.h.
#define FO_DEFINE_SIGNALING_GEMM_INSTANCE(NAME, ELEMENT, BM, BN, CM, SCHEDULE, WEIGHT)      \
  FO_DEFINE_SIGNALING_GEMM_INSTANCE_FOR(NAME, ELEMENT, BM, BN, CM, SCHEDULE, WEIGHT, false)
// PEER_STORES: Config's kPeerStores_ (the launches with several mirrors).
#define FO_DEFINE_SIGNALING_GEMM_INSTANCE_FOR(NAME, ELEMENT, BM, BN, CM, SCHEDULE, WEIGHT, PEER_STORES) \
  namespace {                                                                               \
  using NAME##Cfg = ::flashoverlap::sg::Config<ELEMENT, BM, BN, CM,                          \
                                               ::flashoverlap::sg::ConsumerSchedule::SCHEDULE, \
                                               ::flashoverlap::sg::WeightLayout::WEIGHT, PEER_STORES>; \
  static_assert(::flashoverlap::sg::AccumulatorLayoutIsCanonical<NAME##Cfg>(),              \
                "wgmma accumulator layout differs from the one the epilogue assumes");      \
  }                                                                                         \
  const InstanceOps& NAME() {                                                               \
    static const InstanceOps ops = {BM, BN, CM, NAME##Cfg::kStages,                          \
                                    ::flashoverlap::sg::Instance<NAME##Cfg>::kSmemBytes,   \
                                    NAME##Cfg::kMaxSplitSlots,                               \
                                    (NAME##Cfg::kOverlapEpilogue && !NAME##Cfg::kStagedHalves) || \
                                        NAME##Cfg::kPingPong,                                \
                                    &::flashoverlap::sg::Instance<NAME##Cfg>::Prepare,      \
                                    &::flashoverlap::sg::Instance<NAME##Cfg>::Launch};      \
    return ops;                                                                             \
  }

}  // namespace sg
}  // namespace flashoverlap
