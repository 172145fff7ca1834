// Inputs and float32 host references of tests/cuda/overlap_harness.cc: every rank can build
// every rank's inputs (a hash of seed, tensor, rank and index), so each rank computes the
// exact result it must receive without any communication of its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

inline float BF16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBF16(float f) {  // round to nearest even (inputs are finite)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Uniform in [-sqrt(3), sqrt(3)) (unit variance) times `scale`, rounded to bfloat16.
inline uint16_t RandomBF16(uint64_t seed, uint64_t tensor, uint64_t rank, uint64_t i,
                           float scale) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (tensor << 56) ^ (rank << 48) ^ i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64 finalizer
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
  return FloatToBF16((2.0f * u - 1.0f) * 1.7320508f * scale);
}

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint16_t> bf16;  // row-major
  float at(int64_t r, int64_t c) const { return BF16ToFloat(bf16[r * cols + c]); }
};

inline Matrix RandomMatrix(int64_t rows, int64_t cols, uint64_t seed, uint64_t tensor,
                           uint64_t rank, float scale) {
  Matrix a{rows, cols, std::vector<uint16_t>(rows * cols)};
  for (int64_t i = 0; i < rows * cols; ++i) a.bf16[i] = RandomBF16(seed, tensor, rank, i, scale);
  return a;
}

// (x @ w)[r0:r1, c0:c1] in float32, added into `acc` ([r1 - r0, c1 - c0], row-major).
inline void AddProduct(const Matrix& x, const Matrix& w, int64_t r0, int64_t r1, int64_t c0,
                       int64_t c1, std::vector<float>* acc) {
  const int64_t width = c1 - c0;
  std::vector<float> wf(w.rows * width);
  for (int64_t k = 0; k < w.rows; ++k)
    for (int64_t c = c0; c < c1; ++c) wf[k * width + c - c0] = w.at(k, c);
  for (int64_t r = r0; r < r1; ++r) {
    float* row = acc->data() + (r - r0) * width;
    for (int64_t k = 0; k < x.cols; ++k) {
      const float a = x.at(r, k);
      const float* wr = wf.data() + k * width;
      for (int64_t c = 0; c < width; ++c) row[c] += a * wr[c];
    }
  }
}

struct Problem {
  std::vector<uint16_t> x, w;   // this rank's inputs
  std::vector<float> expected;  // what this rank's output must hold, row-major
  std::vector<uint16_t> gathered;  // "ag": all_gather(x), which must come back bit for bit
};

// op: "ar" (sum_r x_r @ w_r), "rs" (this rank's rows of it), "a2a" (all_to_all of x_r @ w_r,
// split 0 / concat 0), "a2a11" (split 1 / concat 1), "ag" (all_gather(x) @ w_rank), "pr" (world
// 1: the block-0 rows of a rank that is its own peer, EnsurePeerStoresLoopback).
inline Problem MakeProblem(const std::string& op, int64_t m, int64_t n, int64_t k,
                           int64_t world, int64_t rank, uint64_t seed) {
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(k));
  const int64_t x_rows = op == "ag" ? m / world : m;
  std::vector<Matrix> xs, ws;
  for (int64_t r = 0; r < world; ++r) {
    xs.push_back(RandomMatrix(x_rows, k, seed, 1, r, 1.0f));
    ws.push_back(RandomMatrix(k, n, seed, 2, r, w_scale));
  }
  Problem p{xs[rank].bf16, ws[rank].bf16, {}, {}};
  const int64_t rows = m / world, cols = n / world;
  if (op == "ar" || op == "rs") {
    const int64_t r0 = op == "rs" ? rank * rows : 0, r1 = op == "rs" ? r0 + rows : m;
    p.expected.assign((r1 - r0) * n, 0.0f);
    for (int64_t r = 0; r < world; ++r) AddProduct(xs[r], ws[r], r0, r1, 0, n, &p.expected);
  } else if (op == "a2a") {  // block s (rows) = (x_s @ w_s)[rank's rows]
    p.expected.assign(m * n, 0.0f);
    for (int64_t s = 0; s < world; ++s) {
      std::vector<float> block(rows * n, 0.0f);
      AddProduct(xs[s], ws[s], rank * rows, (rank + 1) * rows, 0, n, &block);
      std::copy(block.begin(), block.end(), p.expected.begin() + s * rows * n);
    }
  } else if (op == "a2a11") {  // block s (columns) = (x_s @ w_s)[:, rank's columns]
    p.expected.assign(m * n, 0.0f);
    for (int64_t s = 0; s < world; ++s) {
      std::vector<float> block(m * cols, 0.0f);
      AddProduct(xs[s], ws[s], 0, m, rank * cols, (rank + 1) * cols, &block);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < cols; ++c) p.expected[r * n + s * cols + c] = block[r * cols + c];
    }
  } else if (op == "ag") {  // rows of block s = x_s @ w_rank
    p.expected.assign(m * n, 0.0f);
    for (int64_t s = 0; s < world; ++s) {
      std::vector<float> block(rows * n, 0.0f);
      AddProduct(xs[s], ws[rank], 0, rows, 0, n, &block);
      std::copy(block.begin(), block.end(), p.expected.begin() + s * rows * n);
      p.gathered.insert(p.gathered.end(), xs[s].bf16.begin(), xs[s].bf16.end());
    }
  } else if (op == "pr") {  // loopback peer stores (world 1): x[block 0] @ w + x[block 1] @ w
    p.expected.assign(m / 2 * n, 0.0f);
    AddProduct(xs[0], ws[0], 0, m / 2, 0, n, &p.expected);
    AddProduct(xs[0], ws[0], m / 2, m, 0, n, &p.expected);
  } else {
    throw std::invalid_argument("MakeProblem: unknown op " + op);
  }
  return p;
}
