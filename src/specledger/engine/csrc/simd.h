// What the engine's CPU kernels share at the lane level: the AVX2 function attribute, eight floats loaded from
// fp32, bf16 or fp16 memory, and the horizontal sum of eight floats. Included by qmm_common.h (so qmm.cpp and
// qmm_avx2/_vnni/_amx.cpp), fused.cpp and bf16mm.cpp. Each .cpp is its own translation unit: everything here is
// inline.
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

// the sum of v's eight lanes (a fixed order: a row's sum does not depend on its neighbours)
SL_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace specledger_simd
