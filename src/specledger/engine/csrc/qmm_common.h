// Weight-only quantized matrix products on x86 CPUs, for specledger's engine (engine/qkernel.py builds
// qmm*.cpp into one library; engine/quant.py packs the weights and calls it). What every instruction-set path
// shares: the operands (Args), the activation quantization, the output stores and the grouping of rows.
// One file per path: qmm_avx2.cpp, qmm_vnni.cpp, qmm_amx.cpp; qmm.cpp chooses one per product (the torch op).
// The reference they are all tested against is plain PyTorch (tests/engine/test_qkernel.py, reference_product).
//
// y[M, N] = x[M, K] @ W^T with W stored as
//   bits 4: unsigned 4-bit codes u, w = d * u + m per group of `group` inputs (the GGUF Q4_1 form)
//   bits 8: signed 8-bit codes q,   w = d * q     per block of 32 inputs   (the GGUF Q8_0 form)
// Activations are quantized on the fly per block of 32 into integers Q, so each 32-block is an integer dot
// product scaled once in float: with `digits` 2 (the default), Q = 254 q + r has two int8 digits (~15 bits
// against the block's largest value, finer than bf16's 8-bit mantissa; twice the integer work); with 1,
// Q = q is one int8 digit (scale amax / 127), as llama.cpp quantizes activations for its own products.
// Except: on the AVX2 path (no VNNI) a 4-bit product of 8 rows or more dequantizes the weights to fp32 and
// multiplies the fp32 activations themselves (tile_avx2_fp), whatever `digits` says: cheaper there than integers.
//
// The SIMD lanes are weight rows, not inputs: a tile is 16 weight rows, stored so that one load gives
// 4 consecutive inputs of each of them (AVX2 takes 8 rows per register, AVX-512 16), multiplied by those
// 4 inputs of one activation row broadcast to every lane (AVX2 maddubs, AVX-512 VNNI dpbusd). A tile's
// weights are loaded and unpacked once for a group of up to 4 activation rows and stay in L1 while the
// other groups pass, and no horizontal sums are needed: more rows cost arithmetic, not memory traffic.
// That arithmetic makes VNNI compute-bound from a few rows on; with AMX-INT8 (isa 3) a block's 32 inputs of
// 16 activation rows times 16 weight rows are one tile product per digit (the 8-bit layout below is already
// AMX's B layout), costing about as much for 1 row as for 16, so products of enough rows (amx_rows) take it.
// Its int32 sums are VNNI's exactly and go through the same float steps: the products are bit-identical.
//
// Layout (quant.py's pack_int4 / pack_int8 write it; N is padded to a multiple of 16 with zeros):
//   bits 4: [N/16, K/32, 4, 64] bytes: chunk j of block b holds, at byte 4 c + e, input 32 b + 8 j + e of
//           weight row c (0..15) in its low nibble and input 32 b + 8 j + 4 + e in its high nibble;
//   bits 8: [N/16, K/32, 8, 64] int8: step j, byte 4 c + e = input 32 b + 4 j + e of weight row c;
//   scales d (and mins m, bits 4): [N/16, groups, 16] fp16.
#pragma once

#include <ATen/core/Tensor.h>

#include <immintrin.h>

#include "simd.h"

#include <cstdint>

#define SL_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// AMX intrinsics need gcc 11 / clang 12: an older compiler builds the kernel without them (VNNI at most)
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SL_HAVE_AMX 1
#else
#define SL_HAVE_AMX 0
#endif

#define SL_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

// a named namespace: the paths are separate translation units of one library
namespace specledger_qmm {

enum Isa : int64_t { kNone = 0, kAvx2 = 1, kVnni = 2, kAmx = 3 };

struct Args {
  const uint8_t* w;     // packed codes
  const uint16_t* d;    // fp16 scales [N/16, gd, 16]
  const uint16_t* m;    // fp16 mins [N/16, g, 16] (bits 4)
  const int8_t* qa;     // activation codes [M, K] (the high digit when there are two)
  const int8_t* qb;     // the low digit [M, K], or nullptr
  const float* da;      // activation scales [M, nb]
  const float* sa;      // activation sums d * sum(Q) per weight group [M, g] (bits 4)
  const int32_t* qs;    // activation code sums sum(Q) per block [M, nb] (bits 8)
  const float* xf;      // the activations in fp32 (AVX2 4-bit products of many rows) per group of 8 rows as [K, 8]
  void* y;              // [M, N], in the activations' dtype (float32 with a residual)
  const float* res;     // [M, N] float32 added to the product, or nullptr
  int64_t out_kind;     // 0 float32, 1 bfloat16, 2 float16
  int64_t k, nb, g, gshift, gd, gdshift, n;
};

// ---------------------------------------------------------------------------------------------
// the paths (one file each): rows [r0, rows) of weight tiles [t0, t1)

void avx2_tiles(const Args& a, int64_t bits, int64_t digits, int64_t r0, int64_t rows, int64_t t0, int64_t t1);
// AVX2, bits 4, many rows: fp32 activations (avx2_fp_activations wrote a.xf) times dequantized weights
void avx2_fp_tiles(const Args& a, int64_t rows, int64_t t0, int64_t t1);
void avx2_fp_activations(const at::Tensor& x, float* out);
void vnni_tiles(const Args& a, int64_t bits, int64_t digits, int64_t r0, int64_t rows, int64_t t0, int64_t t1);
#if SL_HAVE_AMX
// rows in groups of 16; a last group of fewer than min_rows takes VNNI
void amx_tiles(const Args& a, int64_t bits, int64_t digits, int64_t rows, int64_t t0, int64_t t1, int64_t min_rows);
#endif

// ---------------------------------------------------------------------------------------------
// activation quantization (qmm.cpp, before any path runs)

using specledger_simd::load8;

SL_AVX2 inline int32_t hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// One row, per block of 32: v = x * 127 / amax, the high digit q = round(v) (ties to even) and, with two
// digits, the low digit r = round((v - q) * 254), so x = d * Q with Q = 254 q + r, d = amax / (127 * 254)
// (one digit: Q = q, d = amax / 127). Also the blocks' sums of Q, and d * sum(Q) per weight group.
SL_AVX2 inline __m256i pack32(const __m256i* i32) {
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]), p16b = _mm256_packs_epi32(i32[2], i32[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
}

template <typename T>
SL_AVX2 void quantize_row(const T* x, int64_t k, int64_t gshift, int8_t* q, int8_t* qlo, float* d, int32_t* qs,
                          float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const int64_t nb = k / 32;
  constexpr int R = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t g = 0; g < (nb >> gshift); ++g) s[g] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = load8<T>(x + b * 32 + i * 8);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 mul = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i hi[4], lo[4];
    __m256i tot = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256 sv = _mm256_mul_ps(v[i], mul);
      const __m256 h = _mm256_round_ps(sv, R);
      hi[i] = _mm256_cvtps_epi32(h);
      if (qlo) {
        lo[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(sv, h), _mm256_set1_ps(254.f)), R));
        tot = _mm256_add_epi32(tot, _mm256_add_epi32(_mm256_mullo_epi32(hi[i], _mm256_set1_epi32(254)), lo[i]));
      } else {
        tot = _mm256_add_epi32(tot, hi[i]);
      }
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), pack32(hi));
    if (qlo) _mm256_storeu_si256(reinterpret_cast<__m256i*>(qlo + b * 32), pack32(lo));
    d[b] = qlo ? amax / (127.f * 254.f) : amax / 127.f;
    qs[b] = hsum8i(tot);
    s[b >> gshift] += d[b] * static_cast<float>(qs[b]);
  }
}

// ---------------------------------------------------------------------------------------------
// outputs: y[row, c0 ..] from `cols` floats (the residual added, or rounded to the activations' dtype)

inline void store(const Args& a, int64_t row, int64_t c0, int64_t cols, const float* v) {
  for (int64_t c = 0; c < cols && c0 + c < a.n; ++c) {
    const int64_t i = row * a.n + c0 + c;
    if (a.res)
      static_cast<float*>(a.y)[i] = a.res[i] + v[c];
    else if (a.out_kind == 1)
      static_cast<at::BFloat16*>(a.y)[i] = at::BFloat16(v[c]);
    else if (a.out_kind == 2)
      static_cast<at::Half*>(a.y)[i] = at::Half(v[c]);
    else
      static_cast<float*>(a.y)[i] = v[c];
  }
}

// store() for 16 whole columns in vectors (VNNI and AMX): the same float add, and bfloat16 rounded as at::BFloat16
// rounds (to nearest even, NaN as 0x7FC0), so the outputs equal store()'s; float16 takes store()
SL_VNNI inline void store16(const Args& a, int64_t row, int64_t c0, __m512 v) {
  if (c0 + 16 > a.n || (!a.res && a.out_kind == 2)) {
    alignas(64) float out[16];
    _mm512_store_ps(out, v);
    store(a, row, c0, 16, out);
    return;
  }
  const int64_t i = row * a.n + c0;
  if (a.res) {
    _mm512_storeu_ps(static_cast<float*>(a.y) + i, _mm512_add_ps(_mm512_loadu_ps(a.res + i), v));
  } else if (a.out_kind == 1) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                          _mm512_set1_epi32(0x7FFF));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<at::BFloat16*>(a.y) + i), _mm512_cvtepi32_epi16(r));
  } else {
    _mm512_storeu_ps(static_cast<float*>(a.y) + i, v);
  }
}

// ---------------------------------------------------------------------------------------------
// rows over a tile: Tile::run<MB>(a, r0, t) computes MB (1..kMB) activation rows from r0 against weight tile t

constexpr int kMB = 4;  // activation rows per tile

// rows [r, rows) of tile t in groups of kMB
template <class Tile>
void row_groups(const Args& a, int64_t r, int64_t rows, int64_t t) {
  for (; r + kMB <= rows; r += kMB) Tile::template run<kMB>(a, r, t);
  switch (rows - r) {
    case 3: Tile::template run<3>(a, r, t); break;
    case 2: Tile::template run<2>(a, r, t); break;
    case 1: Tile::template run<1>(a, r, t); break;
    default: break;
  }
}

// Tile<BITS, DIG> over rows [r0, rows) of tiles [t0, t1), each tile staying in L1 while its row groups pass
template <template <int, int> class Tile>
void by_format(const Args& a, int64_t bits, int64_t digits, int64_t r0, int64_t rows, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    if (bits == 4)
      digits == 2 ? row_groups<Tile<4, 2>>(a, r0, rows, t) : row_groups<Tile<4, 1>>(a, r0, rows, t);
    else
      digits == 2 ? row_groups<Tile<8, 2>>(a, r0, rows, t) : row_groups<Tile<8, 1>>(a, r0, rows, t);
  }
}

}  // namespace specledger_qmm
