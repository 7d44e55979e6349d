// bf16 weight products on CPUs without bf16 arithmetic (AVX2-only hosts), for engine/packed_linear.py.
//
// y[M, N] = x[M, K] @ W^T, W bf16 [N, K] as PyTorch holds it (nothing repacked, so a tied LM head
// shares the embedding's storage). Where the CPU lacks AVX-512 BF16 / AMX, PyTorch's bf16 product converts
// through a generic path: on an AVX2 host one row costs 4x the fp32 product and 8 rows 6x one row
// (benchmarks/linear_rows.py). Here a bf16 is the top half of an fp32, so 16 weights load as eight 32-bit lanes
// and two integer ops widen them (even inputs: lane << 16; odd inputs: lane & 0xFFFF0000); the activations are
// widened once per product into fp32 with the same even/odd split per 16 inputs, and each widened weight vector
// serves every row of a group: the rows cost FMAs, not memory traffic. Sums in fp32, in the same order for a row
// whatever the other rows are (a batch's rows equal each row alone, bit for bit).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <immintrin.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using specledger_simd::hsum;
using specledger_simd::load8;

// x row as fp32, per 16 inputs: the 8 even ones, then the 8 odd ones (the order the weights widen into)
template <typename T>
SL_AVX2 void widen_row(const T* x, int64_t k, float* out) {
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm256_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15);
  alignas(32) float tmp[16];
  for (int64_t b = 0; b < k; b += 16) {
    _mm256_store_ps(tmp, load8<T>(x + b));
    _mm256_store_ps(tmp + 8, load8<T>(x + b + 8));
    _mm256_storeu_ps(out + b, _mm256_i32gather_ps(tmp, even, 4));
    _mm256_storeu_ps(out + b + 8, _mm256_i32gather_ps(tmp, odd, 4));
  }
}

struct Args {
  const float* xs;     // [M, K] widened activations
  const uint16_t* w;   // [N, K] bf16
  void* y;             // [M, N] in x's dtype
  bool bf16_out;
  int64_t k, n;
};

inline uint16_t round_bf16(float f) {  // to nearest even, NaN kept quiet: as at::BFloat16 rounds
  return at::BFloat16(f).x;
}

// MB activation rows from r0 against NW weight rows from n0
template <int MB, int NW>
SL_AVX2 void tile(const Args& a, int64_t r0, int64_t n0) {
  const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  __m256 acc[MB][NW];
  for (int r = 0; r < MB; ++r)
    for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_setzero_ps();
  const uint16_t* wp = a.w + n0 * a.k;
  const float* xp = a.xs + r0 * a.k;
  for (int64_t b = 0; b < a.k; b += 16) {
    __m256 we[NW], wo[NW];
    for (int j = 0; j < NW; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + j * a.k + b));
      we[j] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      wo[j] = _mm256_castsi256_ps(_mm256_and_si256(raw, hi));
    }
    for (int r = 0; r < MB; ++r) {
      const __m256 xe = _mm256_loadu_ps(xp + r * a.k + b), xo = _mm256_loadu_ps(xp + r * a.k + b + 8);
      for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(wo[j], xo, _mm256_fmadd_ps(we[j], xe, acc[r][j]));
    }
  }
  for (int r = 0; r < MB; ++r)
    for (int j = 0; j < NW; ++j) {
      const int64_t i = (r0 + r) * a.n + n0 + j;
      const float v = hsum(acc[r][j]);
      if (a.bf16_out)
        static_cast<uint16_t*>(a.y)[i] = round_bf16(v);
      else
        static_cast<float*>(a.y)[i] = v;
    }
}

// rows [r0, r1) against weight rows [n0, n1), weight rows in groups of NW (a lone row for the last few)
template <int MB, int NW>
void rows(const Args& a, int64_t r0, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NW <= n1; n += NW) tile<MB, NW>(a, r0, n);
  for (; n < n1; ++n) tile<MB, 1>(a, r0, n);
}

// the weight rows of one group stay in L1 while every row group of the block passes; 8 weight rows for a single
// activation row (8 independent sums hide the FMA latency), 3 for two rows, 2 for three or four. Eight rows take
// one weight row at a time: its loads then overlap the FMAs as the weights stream from DRAM (a SmolLM2-135M pass
// of 8 rows on 2 AVX2 threads, the weights streamed: 38 ms, against 52 ms as two groups of four).
void block(const Args& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  constexpr int64_t kStep = 64;  // weight rows a row group sweeps before the next takes them (~72 KB at K 576)
  for (int64_t s = n0; s < n1; s += kStep) {
    const int64_t e = std::min(n1, s + kStep);
    int64_t r = m0;
    for (; r + 8 <= m1; r += 8) rows<8, 1>(a, r, s, e);
    if (r + 4 <= m1) rows<4, 2>(a, r, s, e), r += 4;
    switch (m1 - r) {
      case 3: rows<3, 2>(a, r, s, e); break;
      case 2: rows<2, 3>(a, r, s, e); break;
      case 1: rows<1, 8>(a, r, s, e); break;
      default: break;
    }
  }
}

at::Tensor bf16mm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "specledger bf16mm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "specledger bf16mm: x must be a contiguous matrix");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kBFloat16,
              "specledger bf16mm: w must be a contiguous bf16 matrix");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "specledger bf16mm: x must be bf16 or fp32");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(w.size(1) == k && k % 16 == 0, "specledger bf16mm: K must match and be a multiple of 16");
  thread_local std::vector<float> xs;  // no allocator call per product
  if (static_cast<int64_t>(xs.size()) < m * k) xs.resize(m * k);
  if (x.scalar_type() == at::kFloat) {
    const float* xp = x.const_data_ptr<float>();
    for (int64_t r = 0; r < m; ++r) widen_row<float>(xp + r * k, k, xs.data() + r * k);
  } else {
    const at::BFloat16* xp = x.const_data_ptr<at::BFloat16>();
    for (int64_t r = 0; r < m; ++r) widen_row<at::BFloat16>(xp + r * k, k, xs.data() + r * k);
  }
  at::Tensor y = at::empty({m, n}, x.options());
  const Args a{xs.data(), reinterpret_cast<const uint16_t*>(w.const_data_ptr()), y.data_ptr(),
               x.scalar_type() == at::kBFloat16, k, n};
  // weight rows split between threads in multiples of 8; activation rows in blocks of 64 (their fp32 copy,
  // 144 KB at K 576, stays in L2 while a block of weight rows sweeps it)
  const int64_t threads = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(8, ((n + threads - 1) / threads + 7) / 8 * 8);
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t r = 0; r < m; r += 64) block(a, r, std::min(m, r + 64), n0, n1);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specledger, lib) {
  lib.def("bf16mm(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(specledger, CPU, lib) { lib.impl("bf16mm", &bf16mm); }
