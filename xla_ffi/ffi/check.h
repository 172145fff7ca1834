// CHECK macros that turn failures into xla::ffi::Error instead of throwing.
// Every CUDA and NCCL return code in the FFI layer goes through one of these.
//
// Messages are built by ErrorMessage, not by std::ostringstream: on the H200 machine every
// handler error whose message streamed a number crashed the process (SIGSEGV inside
// std::ostream::_M_insert<long>, a copy of libstdc++'s number formatting compiled into this
// extension by one g++ and run against another libstdc++, whose locale facets it did not
// find; scripts/diagnose_ffi_error.py, benchmarks/results/logs/ffi_error_h200x1/). An error
// path must not depend on which toolchain built the extension.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace flashoverlap {

namespace ffi = xla::ffi;

// `ErrorMessage() << "op: M=" << m << ...`: strings, characters, booleans, integers, enums
// (as their number) and floating point, appended to a std::string without iostreams.
class ErrorMessage {
 public:
  ErrorMessage& operator<<(std::string_view text) {
    text_.append(text.data(), text.size());
    return *this;
  }
  ErrorMessage& operator<<(const char* text) { return *this << std::string_view(text ? text : "(null)"); }
  ErrorMessage& operator<<(const std::string& text) { return *this << std::string_view(text); }
  ErrorMessage& operator<<(char c) {
    text_.push_back(c);
    return *this;
  }
  ErrorMessage& operator<<(bool value) { return *this << (value ? "true" : "false"); }
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  ErrorMessage& operator<<(T value) {
    text_ += std::to_string(value);
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_enum_v<T>, int> = 0>
  ErrorMessage& operator<<(T value) {
    return *this << static_cast<std::underlying_type_t<T>>(value);
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

// Builds "<op>: <what> [<file>:<line>]" so the Python exception names the op.
inline std::string FormatError(const char* file, int line, const std::string& what) {
  return (ErrorMessage() << what << " [" << file << ":" << line << "]").str();
}

// A handler's implementation that lets no C++ exception out: XLA calls a handler through a C
// function (XLA_FFI_DEFINE_HANDLER_SYMBOL) and catches nothing, so a std::bad_alloc (an error
// message, a vector) or a std::system_error (a mutex) escaping it would end the process. Here
// it becomes ffi::Error::Internal naming `op`. Every handler symbol is defined with it:
// XLA_FFI_DEFINE_HANDLER_SYMBOL(Symbol, NoThrow("target", Impl), binding).
template <typename Impl>
auto NoThrow(const char* op, Impl impl) {
  return [op, impl](auto... args) -> ::xla::ffi::Error {
    try {
      return impl(std::move(args)...);
    } catch (const std::exception& e) {
      return ::xla::ffi::Error::Internal(std::string(op) + ": C++ exception in the handler: " +
                                         e.what());
    } catch (...) {
      return ::xla::ffi::Error::Internal(std::string(op) + ": unknown C++ exception in the handler");
    }
  };
}

}  // namespace flashoverlap

// Returns ffi::Error::InvalidArgument when `cond` is false.
#define FO_CHECK_ARG(cond, msg)                                                   \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::flashoverlap::ErrorMessage fo_msg_;                                       \
      fo_msg_ << msg;                                                             \
      return ::xla::ffi::Error::InvalidArgument(                                  \
          ::flashoverlap::FormatError(__FILE__, __LINE__, fo_msg_.str()));        \
    }                                                                             \
  } while (0)

// Returns ffi::Error::Internal when `cond` is false.
#define FO_CHECK(cond, msg)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::flashoverlap::ErrorMessage fo_msg_;                                       \
      fo_msg_ << msg;                                                             \
      return ::xla::ffi::Error::Internal(                                         \
          ::flashoverlap::FormatError(__FILE__, __LINE__, fo_msg_.str()));        \
    }                                                                             \
  } while (0)

// Returns ffi::Error::Internal naming the CUDA error when `expr` fails.
#define FO_CHECK_CUDA(expr)                                                       \
  do {                                                                            \
    cudaError_t fo_err_ = (expr);                                                 \
    if (fo_err_ != cudaSuccess) {                                                 \
      return ::xla::ffi::Error::Internal(::flashoverlap::FormatError(             \
          __FILE__, __LINE__,                                                     \
          std::string("CUDA error in ") + #expr + ": " +                          \
              cudaGetErrorName(fo_err_) + " (" + cudaGetErrorString(fo_err_) +    \
              ")"));                                                              \
    }                                                                             \
  } while (0)

// Propagates an ffi::Error returned by a helper.
#define FO_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                            \
    ::xla::ffi::Error fo_status_ = (expr);                                        \
    if (fo_status_.failure()) return fo_status_;                                  \
  } while (0)
