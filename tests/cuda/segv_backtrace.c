// Debug aid (scripts/diagnose_ffi_error.py): LD_PRELOAD it to print the native stack of a
// SIGSEGV (library + offset + symbol where exported), then die as before. The GPU machine has
// no gdb. Build: gcc -shared -fPIC -O1 -o segv_backtrace.so tests/cuda/segv_backtrace.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_segv(int sig, siginfo_t* info, void* context) {
  (void)context;
  void* frames[64];
  int n = backtrace(frames, 64);
  fprintf(stderr, "native SIGSEGV at address %p, %d frames:\n", info->si_addr, n);
  for (int i = 0; i < n; ++i) {
    Dl_info where;
    if (dladdr(frames[i], &where) && where.dli_fname) {
      fprintf(stderr, "  #%d %s+0x%lx %s\n", i, where.dli_fname,
              (unsigned long)((char*)frames[i] - (char*)where.dli_fbase),
              where.dli_sname ? where.dli_sname : "?");
    } else {
      fprintf(stderr, "  #%d %p\n", i, frames[i]);
    }
  }
  fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, NULL);
}
