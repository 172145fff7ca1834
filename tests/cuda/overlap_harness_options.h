// Options of tests/cuda/overlap_harness.cc (its header comment says what each does), parsed
// and checked before anything runs; the harness's ways of failing the run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "xla_ffi/comm/status.h"

namespace overlap_harness {

namespace fo = flashoverlap;

struct Options {
  int rank = -1, world = 0, device = -1, calls = 2, comm_sms = 16, grow = 0;
  double watchdog = 0, hold_mutex = 0;
  bool trace = false;
  bool stage_mirrors = false;  // pr ops at world 1: the all-reduce staged as in one process
  int64_t m = 512, n = 512, k = 512;
  std::string id_file, ops = "ar,ar_out,rs,a2a,ag,ag_ce,ag_g,ag_ce_g", inject;  // inject: "", "nccl", "cuda", "hang" or "grow"
};

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "overlap_harness: %s\n", what.c_str());
  std::exit(2);
}

inline void Check(const fo::Status& s, const char* what) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.message);
}

inline void CheckCuda(cudaError_t err, const char* what) { Check(fo::CudaStatus(err, what), what); }

inline bool HasPeerOps(const Options& o) { return ("," + o.ops).find(",pr_") != std::string::npos; }

inline Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--rank") o.rank = std::stoi(value);
    else if (key == "--world") o.world = std::stoi(value);
    else if (key == "--device") o.device = std::stoi(value);
    else if (key == "--calls") o.calls = std::stoi(value);
    else if (key == "--comm-sms") o.comm_sms = std::stoi(value);
    else if (key == "--m") o.m = std::stoll(value);
    else if (key == "--n") o.n = std::stoll(value);
    else if (key == "--k") o.k = std::stoll(value);
    else if (key == "--id-file") o.id_file = value;
    else if (key == "--ops") o.ops = value;
    else if (key == "--inject") o.inject = value;
    else if (key == "--trace") o.trace = value == "1";
    else if (key == "--stage-mirrors") o.stage_mirrors = value == "1";
    else if (key == "--grow") o.grow = std::stoi(value);
    else if (key == "--watchdog") o.watchdog = std::stod(value);
    else if (key == "--hold-mutex") o.hold_mutex = std::stod(value);
    else Fail("unknown option " + key);
  }
  if (!o.inject.empty() && o.inject != "nccl" && o.inject != "cuda" && o.inject != "hang" &&
      o.inject != "grow") {
    Fail("--inject: nccl, cuda, hang or grow");
  }
  if (o.inject == "grow" && (o.world != 1 || !HasPeerOps(o) || o.ops.find(",") != std::string::npos)) {
    Fail("--inject grow: one pr op (--ops pr_rs or pr_ar) at --world 1 (the growth loops back)");
  }
  if (o.inject == "hang" && (o.ops.find(',') != std::string::npos || !HasPeerOps(o) || o.watchdog <= 0)) {
    Fail("--inject hang: one pr op (--ops pr_rs or pr_ar) and --watchdog S (only the watchdog ends it)");
  }
  if (o.hold_mutex != 0 && !(o.inject == "hang" && o.hold_mutex > o.watchdog + 2)) {
    Fail("--hold-mutex H: with --inject hang, H > the watchdog's S + 2");
  }
  if (o.grow < 0) Fail("--grow: a count >= 0");
  if (!(o.watchdog >= 0)) Fail("--watchdog: seconds >= 0 (0: off)");
  if (o.world != 1 && HasPeerOps(o) && o.grow > 0) {
    Fail("--grow with pr ops: --world 1 only (a group spanning processes grows collectively, "
         "each growth followed by the exchange JAX's lowering makes; this thread would not)");
  }
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world || o.id_file.empty()) {
    Fail("need --rank R --world N (0 <= R < N) and --id-file PATH");
  }
  if (o.m % (2 * o.world) != 0 || o.n % (8 * o.world) != 0 || o.k % 8 != 0 || o.m < 64 * o.world) {
    Fail("need M a multiple of 2 * world and >= 64 * world, N of 8 * world, K of 8");
  }
  return o;
}

}  // namespace overlap_harness
