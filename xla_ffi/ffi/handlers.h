// XLA FFI handler symbols exported by the extension, one declaration and one X-macro entry
// per handler. Naming: C++ <Name>Impl -> handler symbol Flashoverlap<Name> -> FFI target
// flashoverlap_<name>. xla_ffi/module.cc registers every entry of FLASHOVERLAP_FFI_HANDLERS
// as a custom-call target on platform "CUDA".
#pragma once

#include "xla/ffi/api/api.h"

// flashoverlap_gemm: out[M,N] = x[M,K] @ w[K,N] through the signaling GEMM (gemm.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapGemm);
// flashoverlap_gemm_all_reduce / _reduce_scatter: GEMM overlapped with NCCL (gemm_collective.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapGemmAllReduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapGemmReduceScatter);
// flashoverlap_collective: the communication half alone, for timing (collective.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapCollective);
// flashoverlap_gemm_all_to_all: GEMM overlapped with an all-to-all (gemm_all_to_all.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapGemmAllToAll);
// flashoverlap_all_gather_gemm: all-gather overlapped with the GEMM it feeds (all_gather_gemm.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FlashoverlapAllGatherGemm);

// X(target_name, handler_symbol)
#define FLASHOVERLAP_FFI_HANDLERS(X)                                      \
  X("flashoverlap_gemm", FlashoverlapGemm)                                \
  X("flashoverlap_gemm_all_reduce", FlashoverlapGemmAllReduce)            \
  X("flashoverlap_gemm_reduce_scatter", FlashoverlapGemmReduceScatter)   \
  X("flashoverlap_collective", FlashoverlapCollective)                    \
  X("flashoverlap_gemm_all_to_all", FlashoverlapGemmAllToAll)             \
  X("flashoverlap_all_gather_gemm", FlashoverlapAllGatherGemm)
