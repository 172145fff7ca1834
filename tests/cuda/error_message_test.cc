// Host test of the FFI handlers' error macros (xla_ffi/ffi/check.h), run by
// tests/test_error_message.py with g++ on the CPU: the code each macro returns and the message
// it builds from strings, integers of every width and sign, enums, booleans and floating
// point (ErrorMessage, no iostreams). Prints one line per failed check; exit status 1 then.
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/ffi/check.h"

namespace {

namespace ffi = xla::ffi;

int failures = 0;

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

enum class Kind : int { kA = 3 };

ffi::Error CheckArg(int64_t m, int32_t world, size_t bytes, const char* op) {
  FO_CHECK_ARG(m % world == 0, op << ": M=" << m << " not divisible by " << world << ", "
                                   << bytes << " bytes, " << std::string("kind ") << Kind::kA
                                   << ' ' << true << " " << -7 << " " << 0.5f);
  return ffi::Error::Success();
}

ffi::Error CheckInternal(bool ok) {
  FO_CHECK(ok, "op: failed with " << uint64_t{18446744073709551615ull});
  return ffi::Error::Success();
}

ffi::Error Propagate(int64_t m) {
  FO_RETURN_IF_ERROR(CheckArg(m, 2, 8, "inner"));
  return ffi::Error::Internal("not reached");
}

ffi::Error Throwing(int kind, ffi::Error* out) {
  if (kind == 1) throw std::bad_alloc();
  if (kind == 2) throw std::runtime_error("boom");
  if (kind == 3) throw 7;  // not a std::exception
  *out = ffi::Error::Success();
  return ffi::Error::InvalidArgument("returned, not thrown");
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

int main() {
  ffi::Error ok = CheckArg(8, 2, 16, "op");
  Expect(ok.success(), "a passing FO_CHECK_ARG returns success");

  ffi::Error bad = CheckArg(-9, 2, 16, "flashoverlap_test");
  Expect(bad.failure() && bad.errc() == ffi::ErrorCode::kInvalidArgument,
         "FO_CHECK_ARG returns INVALID_ARGUMENT");
  const std::string want = "flashoverlap_test: M=-9 not divisible by 2, 16 bytes, kind 3 true -7 0.500000";
  Expect(StartsWith(bad.message(), want), "message '" + bad.message() + "' starts with '" + want + "'");
  Expect(bad.message().find(" [") != std::string::npos &&
             bad.message().find("error_message_test.cc:") != std::string::npos &&
             bad.message().back() == ']',
         "message '" + bad.message() + "' ends with [file:line]");

  ffi::Error internal = CheckInternal(false);
  Expect(internal.errc() == ffi::ErrorCode::kInternal, "FO_CHECK returns INTERNAL");
  Expect(StartsWith(internal.message(), "op: failed with 18446744073709551615"),
         "unsigned 64-bit value in '" + internal.message() + "'");
  Expect(CheckInternal(true).success(), "a passing FO_CHECK returns success");

  ffi::Error inner = Propagate(3);
  Expect(inner.errc() == ffi::ErrorCode::kInvalidArgument && StartsWith(inner.message(), "inner: M=3"),
         "FO_RETURN_IF_ERROR passes the helper's error on: '" + inner.message() + "'");

  const char* null_text = nullptr;
  const std::string with_null = (flashoverlap::ErrorMessage() << "x=" << null_text).str();
  Expect(with_null == "x=(null)", "a null C string prints as (null): '" + with_null + "'");

  // NoThrow: a handler's exception becomes INTERNAL naming the op; a returned error passes.
  auto handler = flashoverlap::NoThrow("flashoverlap_test_op", Throwing);
  ffi::Error unused = ffi::Error::Internal("unset");
  ffi::Error returned = handler(0, &unused);
  Expect(returned.errc() == ffi::ErrorCode::kInvalidArgument &&
             returned.message() == "returned, not thrown" && unused.success(),
         "NoThrow passes a returned error on: '" + returned.message() + "'");
  const char* wants[] = {"flashoverlap_test_op: C++ exception in the handler: std::bad_alloc",
                         "flashoverlap_test_op: C++ exception in the handler: boom",
                         "flashoverlap_test_op: unknown C++ exception in the handler"};
  for (int kind = 1; kind <= 3; ++kind) {
    ffi::Error caught = handler(kind, &unused);
    Expect(caught.errc() == ffi::ErrorCode::kInternal && caught.message() == wants[kind - 1],
           "NoThrow turns exception " + std::to_string(kind) + " into '" + wants[kind - 1] +
               "': got '" + caught.message() + "'");
  }

  // CatchExceptions: a call's steps that throw give an error status (FinishCall still runs).
  for (int kind = 0; kind <= 3; ++kind) {
    ffi::Error ignored = ffi::Error::Internal("unset");
    const flashoverlap::Status s = flashoverlap::CatchExceptions([&]() -> flashoverlap::Status {
      const ffi::Error e = Throwing(kind, &ignored);  // kind 0: returns
      return flashoverlap::Status::Error("returned: " + e.message());
    });
    const char* steps_want[] = {"returned: returned, not thrown", "C++ exception: std::bad_alloc",
                                "C++ exception: boom", "unknown C++ exception"};
    Expect(s.message == steps_want[kind], "CatchExceptions gives '" + std::string(steps_want[kind]) +
                                              "' for kind " + std::to_string(kind) + ": got '" +
                                              s.message + "'");
  }
  Expect(flashoverlap::CatchExceptions([] { return flashoverlap::Status::Ok(); }).ok(),
         "CatchExceptions passes Ok on");

  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
