// The AVX-512 VNNI path of the quantized products (qmm_common.h: the layout, the operands; qmm.cpp chooses the
// path): integer tiles of all 16 weight rows of a tile per register (dpbusd). AMX (qmm_amx.cpp) hands it the
// last rows of a product too few for a tile product, and matches its sums and float steps bit for bit.

#include "qmm_common.h"

#include <cstdint>
#include <cstring>

namespace specledger_qmm {
namespace {

SL_VNNI inline __m512i bcast4z(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Weights are read once per token from memory, one tile after the other: with the hardware prefetcher alone one
// core streamed ~2/3 of what a plain sum reads; asking for the codes kAhead blocks ahead (a prefetch never faults,
// so past a tile's end is harmless) made a 1.5B model's step of products 0.94x / 0.89x as long at 2 / 1 threads
// (A/A 0.995 / 0.953; benchmarks/kernel_builds.py, BENCHMARKS.md). The same sums: the products are unchanged.
constexpr int64_t kAhead = 12;

// AVX-512 VNNI: all 16 weight rows of tile t.
template <int MB, int BITS, int DIG>
SL_VNNI void tile_vnni(const Args& a, int64_t r0, int64_t t) {
  constexpr int64_t BB = BITS == 4 ? 256 : 512;
  const uint8_t* wt = a.w + t * a.nb * BB;
  const uint16_t* dt = a.d + t * a.gd * 16;
  const uint16_t* mt = BITS == 4 ? a.m + t * a.g * 16 : nullptr;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t gmask = (int64_t{1} << a.gshift) - 1;
  for (int64_t b = 0; b < a.nb; ++b) {
    __m512i s[MB], s2[MB];
    for (int r = 0; r < MB; ++r) s[r] = s2[r] = _mm512_setzero_si512();
    if (BITS == 4) {
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(wt + (b + kAhead) * BB + j * 64), _MM_HINT_T0);
        const __m512i raw = _mm512_loadu_si512(wt + b * BB + j * 64);
        const __m512i w0 = _mm512_and_si512(raw, m4), w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        for (int r = 0; r < MB; ++r) {
          const int64_t off = (r0 + r) * a.k + b * 32 + j * 8;
          s[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[r], w0, bcast4z(a.qa + off)), w1, bcast4z(a.qa + off + 4));
          if (DIG == 2)
            s2[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s2[r], w0, bcast4z(a.qb + off)), w1, bcast4z(a.qb + off + 4));
        }
      }
    } else {  // signed codes + 128 are unsigned for dpbusd; the 128 * sum(q_x) that adds is taken off below
      for (int j = 0; j < 8; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(wt + (b + kAhead) * BB + j * 64), _MM_HINT_T0);
        const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(wt + b * BB + j * 64), flip);
        for (int r = 0; r < MB; ++r) {
          const int64_t off = (r0 + r) * a.k + b * 32 + j * 4;
          s[r] = _mm512_dpbusd_epi32(s[r], w, bcast4z(a.qa + off));
          if (DIG == 2) s2[r] = _mm512_dpbusd_epi32(s2[r], w, bcast4z(a.qb + off));
        }
      }
    }
    if (DIG == 2)
      for (int r = 0; r < MB; ++r) s[r] = _mm512_add_epi32(_mm512_mullo_epi32(s[r], _mm512_set1_epi32(254)), s2[r]);
    if (BITS == 8)
      for (int r = 0; r < MB; ++r) s[r] = _mm512_sub_epi32(s[r], _mm512_set1_epi32(128 * a.qs[(r0 + r) * a.nb + b]));
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dt + (b >> a.gdshift) * 16)));
    for (int r = 0; r < MB; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), _mm512_mul_ps(dw, _mm512_set1_ps(a.da[(r0 + r) * a.nb + b])),
                               acc[r]);
    if (BITS == 4 && (b & gmask) == 0) {
      const int64_t g = b >> a.gshift;
      const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt + g * 16)));
      for (int r = 0; r < MB; ++r) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.sa[(r0 + r) * a.g + g]), acc[r]);
    }
  }
  for (int r = 0; r < MB; ++r) store16(a, r0 + r, t * 16, acc[r]);
}

template <int BITS, int DIG>
struct VnniTile {
  template <int MB>
  static void run(const Args& a, int64_t r0, int64_t t) { tile_vnni<MB, BITS, DIG>(a, r0, t); }
};

}  // namespace

void vnni_tiles(const Args& a, int64_t bits, int64_t digits, int64_t r0, int64_t rows, int64_t t0, int64_t t1) {
  by_format<VnniTile>(a, bits, digits, r0, rows, t0, t1);
}

}  // namespace specledger_qmm
