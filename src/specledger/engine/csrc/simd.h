// What both CPU kernels (qmm.cpp, fused.cpp) read and write through: the AVX2 function attribute, and eight
// floats loaded from fp32 or bf16 memory. Each .cpp is its own translation unit: everything here is inline.
#pragma once

#include <ATen/core/Tensor.h>

#include <immintrin.h>

#define SL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace specledger_simd {

template <typename T>
SL_AVX2 inline __m256 load8(const T* p);
template <>
SL_AVX2 inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
SL_AVX2 inline __m256 load8<at::BFloat16>(const at::BFloat16* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));  // a bf16 is the top half of an fp32
}
template <>
SL_AVX2 inline __m256 load8<at::Half>(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace specledger_simd
