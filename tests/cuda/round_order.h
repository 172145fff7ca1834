// The order of a timing round (TimeInterleaved in gemm_test_common.cuh): row `round` of a
// balanced Latin square over n sequences (a Williams design), the same square as
// jax_flashoverlap.bench.round_order (tests/test_bench.py compares them). Over n rounds (2n
// for odd n) each sequence takes each place and follows each other sequence equally often:
// a fixed order's place moved a GEMM's time by up to 6% on an H100 (session 47), a rotated
// order's fixed predecessor 2-4% (session 48). Host code only.
#pragma once

#include <cstddef>

inline size_t BalancedRoundIndex(size_t n, size_t round, size_t place) {
  // odd n: every other square reversed (a Williams design needs 2n rows there)
  if (n % 2 == 1 && (round / n) % 2 == 1) place = n - 1 - place;
  // the first row: 0, 1, n-1, 2, n-2, ... (every difference between neighbours once)
  const size_t first = place == 0 ? 0 : place % 2 == 1 ? (place + 1) / 2 : n - place / 2;
  return (first + round) % n;
}
