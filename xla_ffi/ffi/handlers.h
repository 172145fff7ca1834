// Every XLA FFI handler of the extension: one declaration and one line in the X-macro list
// per handler. module.cc registers each list entry as an FFI target on platform CUDA.
// Naming (DESIGN.md): C++ GemmImpl -> handler FlashoverlapGemm -> target "flashoverlap_gemm".
#pragma once

#include "xla/ffi/api/ffi.h"

// X(target_name, handler_symbol). Add an entry when its handler's .cc/.cu file lands.
#define FLASHOVERLAP_FFI_HANDLERS(X)
