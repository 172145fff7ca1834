// Checks of the stream word operations the peer-store sequence is built from (stream_wait.h,
// stream_write.h), both methods each: waits across the wrap of int32 (WaitWrap) and flag
// writes (WriteMethods). Included by peer_reduce_test.cu after peer_reduce_common.cuh.
#pragma once

#include <cstdlib>
#include <string>

#include "peer_reduce_common.cuh"

namespace {

// ------------------------------------------------------------------ wait_wrap

// EnqueueWaitGeq across the wrap of int32, both methods: a word at INT32_MAX has not reached
// INT32_MIN (the next number), so the wait must still run after 200 ms (`seen < value` let it
// pass at once: the spin kernel did, the stream operation never did), and must end once the
// word is written; a word at INT32_MIN + 5 has reached INT32_MAX - 5 (no wait).
void WaitWrap() {
  cudaStream_t waiter, writer;
  CK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
  CK(LoadSpinWaitKernel());  // loaded now: a lazy load later would wait for the spinning one
  Buf word(sizeof(int32_t));
  const int32_t kMax = INT32_MAX, kMin = INT32_MIN, kAhead = INT32_MIN + 5;
  for (WaitMethod method : {WaitMethod::kStreamOp, WaitMethod::kSpinKernel}) {
    const char* name = method == WaitMethod::kStreamOp ? "stream op" : "spin kernel";
    CK(cudaMemcpy(word.p, &kMax, sizeof kMax, cudaMemcpyHostToDevice));
    Must(EnqueueWaitGeq(waiter, static_cast<const int32_t*>(word.p), kMin, method), "wait");
    usleep(200000);
    const bool waiting = cudaStreamQuery(waiter) == cudaErrorNotReady;
    CK(cudaMemcpyAsync(word.p, &kMin, sizeof kMin, cudaMemcpyHostToDevice, writer));
    CK(cudaStreamSynchronize(writer));
    int waited_ms = 0;
    const cudaError_t end = WaitStream(waiter, 5000, &waited_ms);
    CK(cudaMemcpy(word.p, &kAhead, sizeof kAhead, cudaMemcpyHostToDevice));
    Must(EnqueueWaitGeq(waiter, static_cast<const int32_t*>(word.p), kMax - 5, method), "wait");
    int passed_ms = 0;
    const cudaError_t passed = WaitStream(waiter, 5000, &passed_ms);
    const bool pass = waiting && end == cudaSuccess && passed == cudaSuccess && passed_ms < 1000;
    if (!pass) ++g_failures;
    printf("wait_wrap %-11s INT32_MAX vs INT32_MIN still waiting after 200 ms: %s, ended %d ms after "
           "the write (%s); INT32_MIN+5 vs INT32_MAX-5 passed in %d ms (%s)  %s\n", name,
           waiting ? "yes" : "NO", waited_ms, cudaGetErrorName(end), passed_ms,
           cudaGetErrorName(passed), pass ? "PASS" : "FAIL");
    fflush(stdout);
    if (end == cudaErrorNotReady || passed == cudaErrorNotReady) _exit(1);  // a stuck stream
  }
  CK(cudaStreamDestroy(waiter));
  CK(cudaStreamDestroy(writer));
}

// ------------------------------------------------------------------ write_methods

// ChosenWriteMethod follows JAX_FLASHOVERLAP_WAIT (spin: the kernel; unset, empty or unknown:
// the stream operation, which this driver has), and a write by either method lands only once
// the work before it on its stream is done: held behind a spin wait on a gate word, the flag
// must still be 0 after 100 ms, and 42 once the gate opens.
void WriteMethods() {
  const char* saved = getenv("JAX_FLASHOVERLAP_WAIT");
  const std::string before = saved == nullptr ? "" : saved;
  struct EnvCase { const char* value; WriteMethod expected; };
  const EnvCase env_cases[] = {{"spin", WriteMethod::kKernel}, {nullptr, WriteMethod::kStreamOp},
                               {"", WriteMethod::kStreamOp}, {"spinn", WriteMethod::kStreamOp}};
  for (const EnvCase& c : env_cases) {
    if (c.value == nullptr) unsetenv("JAX_FLASHOVERLAP_WAIT"); else setenv("JAX_FLASHOVERLAP_WAIT", c.value, 1);
    const bool pass = ChosenWriteMethod() == c.expected;
    if (!pass) ++g_failures;
    printf("write_methods JAX_FLASHOVERLAP_WAIT=%-7s -> %s  %s\n", c.value == nullptr ? "(unset)" : c.value,
           ChosenWriteMethod() == WriteMethod::kKernel ? "kernel   " : "stream op", pass ? "PASS" : "FAIL");
  }
  if (saved == nullptr) unsetenv("JAX_FLASHOVERLAP_WAIT"); else setenv("JAX_FLASHOVERLAP_WAIT", before.c_str(), 1);

  cudaStream_t writer, side;
  CK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(LoadSpinWaitKernel());
  CK(LoadWriteFlagKernel());
  Buf words(2 * sizeof(int32_t));  // [gate, flag]
  int32_t* gate = static_cast<int32_t*>(words.p);
  int32_t* flag = gate + 1;
  for (WriteMethod method : {WriteMethod::kStreamOp, WriteMethod::kKernel}) {
    const char* name = method == WriteMethod::kStreamOp ? "stream op" : "kernel";
    CK(cudaMemsetAsync(words.p, 0, 2 * sizeof(int32_t), side));
    CK(cudaStreamSynchronize(side));
    Must(EnqueueWaitGeq(writer, gate, 1, WaitMethod::kSpinKernel), "gate wait");
    Must(EnqueueWriteFlag(writer, flag, 42, method), "flag write");
    usleep(100000);
    int32_t held = -1, landed = -1;
    CK(cudaMemcpyAsync(&held, flag, sizeof held, cudaMemcpyDeviceToHost, side));
    CK(cudaStreamSynchronize(side));
    const int32_t one = 1;
    CK(cudaMemcpyAsync(gate, &one, sizeof one, cudaMemcpyHostToDevice, side));
    CK(cudaStreamSynchronize(side));
    int waited_ms = 0;
    const cudaError_t end = WaitStream(writer, 5000, &waited_ms);
    if (end == cudaErrorNotReady) _exit(1);  // a stuck stream
    CK(cudaMemcpy(&landed, flag, sizeof landed, cudaMemcpyDeviceToHost));
    const bool pass = held == 0 && end == cudaSuccess && landed == 42;
    if (!pass) ++g_failures;
    printf("write_methods %-9s flag behind the closed gate: %d, after it opened: %d (%s)  %s\n", name, held,
           landed, cudaGetErrorName(end), pass ? "PASS" : "FAIL");
    fflush(stdout);
  }
  CK(cudaStreamDestroy(writer));
  CK(cudaStreamDestroy(side));
}

}  // namespace
