// The AVX2 path of the quantized products (qmm_common.h: the layout, the operands; qmm.cpp chooses the path):
// integer tiles of 8 weight rows (maddubs), and for 4-bit products of many rows fp32 tiles (tile_avx2_fp).

#include "qmm_common.h"

#include <array>
#include <cstdint>
#include <cstring>

namespace specledger_qmm {
namespace {

SL_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

constexpr int64_t kAvx2Ahead = 8;  // blocks prefetched ahead on the AVX2 path

// AVX2: the 8 weight rows of half h of tile t, or (HV 2) both halves in one pass over the tile, each activation
// broadcast serving both (fewer loads and loop steps a row: the one- and two-row products of decoding take it).
template <int MB, int BITS, int DIG, int HV = 1>
SL_AVX2 void tile_avx2(const Args& a, int64_t r0, int64_t t, int h) {
  constexpr int64_t BB = BITS == 4 ? 256 : 512;  // bytes per block per tile of 16 weight rows
  const uint8_t* wt = a.w + t * a.nb * BB + h * 32;
  const uint16_t* dt = a.d + t * a.gd * 16 + h * 8;
  const uint16_t* mt = BITS == 4 ? a.m + t * a.g * 16 + h * 8 : nullptr;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MB][HV];
  for (int r = 0; r < MB; ++r)
    for (int v = 0; v < HV; ++v) acc[r][v] = _mm256_setzero_ps();
  const int64_t gmask = (int64_t{1} << a.gshift) - 1;
  for (int64_t b = 0; b < a.nb; ++b) {
    // the blocks kAvx2Ahead on (into the next tile's: tiles are stored one after another), asked for from memory
    // while this block computes: a decode step streams every weight from DRAM once
    if (h == 0)
      for (int64_t l = 0; l < BB; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wt + (b + kAvx2Ahead) * BB + l), _MM_HINT_T0);
    __m256i s[MB][HV], s2[MB][HV];
    for (int r = 0; r < MB; ++r)
      for (int v = 0; v < HV; ++v) s[r][v] = s2[r][v] = _mm256_setzero_si256();
    if (BITS == 4) {
      // int16 sums: 8 steps of 2 products each, |15 * 127 * 2 * 8| < 2^15. Not unrolled: gcc would
      // reassociate the sums and keep every product live at once (spilling to the stack).
#pragma GCC unroll 1
      for (int j = 0; j < 4; ++j) {
        __m256i w0[HV], w1[HV];
        for (int v = 0; v < HV; ++v) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + b * BB + j * 64 + v * 32));
          w0[v] = _mm256_and_si256(raw, m4);
          w1[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        }
        for (int r = 0; r < MB; ++r) {
          const int64_t off = (r0 + r) * a.k + b * 32 + j * 8;
          const __m256i x0 = bcast4(a.qa + off), x1 = bcast4(a.qa + off + 4);
          for (int v = 0; v < HV; ++v) {
            s[r][v] = _mm256_add_epi16(s[r][v], _mm256_maddubs_epi16(w0[v], x0));
            s[r][v] = _mm256_add_epi16(s[r][v], _mm256_maddubs_epi16(w1[v], x1));
          }
          if (DIG == 2) {
            const __m256i y0 = bcast4(a.qb + off), y1 = bcast4(a.qb + off + 4);
            for (int v = 0; v < HV; ++v) {
              s2[r][v] = _mm256_add_epi16(s2[r][v], _mm256_maddubs_epi16(w0[v], y0));
              s2[r][v] = _mm256_add_epi16(s2[r][v], _mm256_maddubs_epi16(w1[v], y1));
            }
          }
        }
      }
      for (int r = 0; r < MB; ++r)
        for (int v = 0; v < HV; ++v) {
          s[r][v] = _mm256_madd_epi16(s[r][v], ones);
          if (DIG == 2) s2[r][v] = _mm256_madd_epi16(s2[r][v], ones);
        }
    } else {
      // signed x signed: |w| * sign(x, w) keeps maddubs' int16 pairs in range (128 * 127 * 2)
#pragma GCC unroll 1
      for (int j = 0; j < 8; ++j) {
        __m256i w[HV], wa[HV];
        for (int v = 0; v < HV; ++v) {
          w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + b * BB + j * 64 + v * 32));
          wa[v] = _mm256_sign_epi8(w[v], w[v]);
        }
        for (int r = 0; r < MB; ++r) {
          const int64_t off = (r0 + r) * a.k + b * 32 + j * 4;
          const __m256i x = bcast4(a.qa + off);
          for (int v = 0; v < HV; ++v)
            s[r][v] = _mm256_add_epi32(s[r][v],
                                       _mm256_madd_epi16(_mm256_maddubs_epi16(wa[v], _mm256_sign_epi8(x, w[v])), ones));
          if (DIG == 2) {
            const __m256i x2 = bcast4(a.qb + off);
            for (int v = 0; v < HV; ++v)
              s2[r][v] = _mm256_add_epi32(
                  s2[r][v], _mm256_madd_epi16(_mm256_maddubs_epi16(wa[v], _mm256_sign_epi8(x2, w[v])), ones));
          }
        }
      }
    }
    for (int v = 0; v < HV; ++v) {
      if (DIG == 2)  // Q = 254 q + r: the two digits' sums combined exactly
        for (int r = 0; r < MB; ++r)
          s[r][v] = _mm256_add_epi32(_mm256_mullo_epi32(s[r][v], _mm256_set1_epi32(254)), s2[r][v]);
      const __m256 dw =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dt + (b >> a.gdshift) * 16 + v * 8)));
      for (int r = 0; r < MB; ++r)
        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][v]),
                                    _mm256_mul_ps(dw, _mm256_set1_ps(a.da[(r0 + r) * a.nb + b])), acc[r][v]);
      if (BITS == 4 && (b & gmask) == 0) {  // the group's min term: m * d_x * sum(q_x) over the group
        const int64_t g = b >> a.gshift;
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt + g * 16 + v * 8)));
        for (int r = 0; r < MB; ++r) acc[r][v] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.sa[(r0 + r) * a.g + g]), acc[r][v]);
      }
    }
  }
  alignas(32) float out[8];
  for (int r = 0; r < MB; ++r)
    for (int v = 0; v < HV; ++v) {
      _mm256_store_ps(out, acc[r][v]);
      store(a, r0 + r, t * 16 + (h + v) * 8, 8, out);
    }
}

// AVX2, 4-bit weights, products of many rows: integer dot products cost more arithmetic per row than FMAs here
// (AVX2 has no VNNI: two maddubs, two adds and a widening per 64 products and digit), so each weight of the tile is
// dequantized once to fp32 (w = d u + m) and serves MB rows of fp32 activations (xf) in FMAs. Q: which of a chunk's
// 8 inputs (its low nibbles are inputs 0-3, its high ones 4-7).
// xp: the group's activations at the chunk's first input, 8 rows per input (the layout avx2_fp_activations writes)
template <int Q, int MB>
SL_AVX2 inline void fp_input(const float* xp, __m256i raw, __m256 d, __m256 m, __m256* acc) {
  constexpr int shift = Q < 4 ? 8 * Q : 8 * (Q - 4) + 4;
  const __m256 u = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(raw, shift), _mm256_set1_epi32(0x0F)));
  const __m256 w = _mm256_fmadd_ps(u, d, m);
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(xp + Q * 8 + r), acc[r]);
}

// The 8 rows from r0 against half h of tile t; into `out` ([8, 16] floats) instead of y when given (a padded group).
SL_AVX2 void tile_avx2_fp(const Args& a, int64_t r0, int64_t t, int h, float* out) {
  constexpr int MB = 8;
  const uint8_t* wt = a.w + t * a.nb * 256 + h * 32;
  const uint16_t* dt = a.d + t * a.g * 16 + h * 8;
  const uint16_t* mt = a.m + t * a.g * 16 + h * 8;
  const float* xg = a.xf + r0 * a.k;  // rows r0.. (r0 a multiple of 8) as [K, 8]
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    if (h == 0)
      for (int64_t l = 0; l < 256; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wt + (b + kAvx2Ahead) * 256 + l), _MM_HINT_T0);
    const int64_t g = b >> a.gshift;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dt + g * 16)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt + g * 16)));
#pragma GCC unroll 1
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + b * 256 + j * 64));
      const float* xp = xg + (b * 32 + j * 8) * 8;
      fp_input<0, MB>(xp, raw, d, m, acc);
      fp_input<1, MB>(xp, raw, d, m, acc);
      fp_input<2, MB>(xp, raw, d, m, acc);
      fp_input<3, MB>(xp, raw, d, m, acc);
      fp_input<4, MB>(xp, raw, d, m, acc);
      fp_input<5, MB>(xp, raw, d, m, acc);
      fp_input<6, MB>(xp, raw, d, m, acc);
      fp_input<7, MB>(xp, raw, d, m, acc);
    }
  }
  alignas(32) float sums[MB][8];
  for (int r = 0; r < MB; ++r) _mm256_store_ps(sums[r], acc[r]);
  for (int r = 0; r < MB; ++r) {
    if (out)
      std::memcpy(out + r * 16 + h * 8, sums[r], sizeof sums[r]);
    else
      store(a, r0 + r, t * 16 + h * 8, 8, sums[r]);
  }
}

constexpr int kAvx2Both = 2;  // row groups of up to this many take both halves of a tile in one pass

template <int BITS, int DIG>
struct Avx2Tile {
  template <int MB>
  static void run(const Args& a, int64_t r0, int64_t t) {
    if constexpr (MB <= kAvx2Both) {
      tile_avx2<MB, BITS, DIG, 2>(a, r0, t, 0);
    } else {
      tile_avx2<MB, BITS, DIG>(a, r0, t, 0);
      tile_avx2<MB, BITS, DIG>(a, r0, t, 1);
    }
  }
};

// x [M, K] as fp32 per group of 8 rows, [K, 8] each (input-major: a tile's broadcasts of 8 rows are adjacent)
template <typename T>
void interleave(const T* x, int64_t m, int64_t k, float* out) {
  for (int64_t r = 0; r < (m + 7) / 8 * 8; ++r)  // the last group's missing rows are zeros
    for (int64_t i = 0; i < k; ++i)
      out[(r / 8) * k * 8 + i * 8 + r % 8] = r < m ? static_cast<float>(x[r * k + i]) : 0.f;
}

}  // namespace

void avx2_tiles(const Args& a, int64_t bits, int64_t digits, int64_t r0, int64_t rows, int64_t t0, int64_t t1) {
  by_format<Avx2Tile>(a, bits, digits, r0, rows, t0, t1);
}

// 4-bit products of many rows (qmm.cpp's avx2_fp) in groups of 8, a last group of fewer rows padded with zero rows
void avx2_fp_tiles(const Args& a, int64_t rows, int64_t t0, int64_t t1) {
  alignas(32) std::array<float, 8 * 16> pad;  // a padded group's outputs, 16 weight rows each
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < rows; r += 8) {
      if (r + 8 <= rows) {
        tile_avx2_fp(a, r, t, 0, nullptr);
        tile_avx2_fp(a, r, t, 1, nullptr);
      } else {
        tile_avx2_fp(a, r, t, 0, pad.data());
        tile_avx2_fp(a, r, t, 1, pad.data());
        for (int64_t i = r; i < rows; ++i) store(a, i, t * 16, 16, pad.data() + (i - r) * 16);
      }
    }
}

void avx2_fp_activations(const at::Tensor& x, float* out) {
  const int64_t m = x.size(0), k = x.size(1);
  switch (x.scalar_type()) {
    case at::kFloat: interleave(x.const_data_ptr<float>(), m, k, out); break;
    case at::kBFloat16: interleave(x.const_data_ptr<at::BFloat16>(), m, k, out); break;
    default: interleave(x.const_data_ptr<at::Half>(), m, k, out); break;
  }
}

}  // namespace specledger_qmm
