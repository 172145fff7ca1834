// pybind11 module jax_flashoverlap._xla_ffi: the FFI handler capsules to register with XLA,
// build information, and (xla_ffi/comm) communicator setup. No computation happens here.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pybind11/pybind11.h>

#include <string>

#include "cutlass/version.h"
#include "xla_ffi/ffi/handlers.h"

namespace py = pybind11;

namespace {

template <typename Fn>
py::capsule EncapsulateHandler(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

py::dict Registrations() {
  py::dict out;
#define FO_REGISTER(target, symbol) out[target] = EncapsulateHandler(symbol);
  FLASHOVERLAP_FFI_HANDLERS(FO_REGISTER)
#undef FO_REGISTER
  return out;
}

py::dict BuildInfo() {
  py::dict out;
  out["cuda_runtime_compiled"] = CUDART_VERSION;
  out["nccl_headers"] = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                        std::to_string(NCCL_PATCH);
  out["cutlass"] = std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) + "." +
                   std::to_string(CUTLASS_PATCH);
  out["cuda_arch"] = "sm_90a";
  return out;
}

std::string NcclVersion() {
  int version = 0;
  ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("ncclGetVersion failed: ") + ncclGetErrorString(result));
  }
  int major = version / 10000, minor = (version % 10000) / 100, patch = version % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace

PYBIND11_MODULE(_xla_ffi, m) {
  m.doc() = "jax_flashoverlap CUDA extension: XLA FFI handlers and NCCL communicator setup";
  m.def("registrations", &Registrations, "FFI target name -> handler capsule (platform CUDA)");
  m.def("build_info", &BuildInfo, "Versions the extension was compiled against");
  m.def("nccl_version", &NcclVersion, "Version of the NCCL library loaded at run time");
}
