// Weight-only quantized matrix products on x86 CPUs, for specledger's engine (engine/qkernel.py builds
// and loads this file; engine/quant.py packs the weights and calls it).
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

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cpuid.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "simd.h"

#include <array>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

namespace {

#define SL_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// AMX intrinsics need gcc 11 / clang 12: an older compiler builds the kernel without them (VNNI at most)
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SL_HAVE_AMX 1
#else
#define SL_HAVE_AMX 0
#endif

#define SL_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

enum Isa : int64_t { kNone = 0, kAvx2 = 1, kVnni = 2, kAmx = 3 };

// AMX needs the tile units (cpuid 7.0 edx: AMX-TILE bit 24, AMX-INT8 bit 25) and, on Linux, the kernel's leave:
// the 8 KB of tile state is handed out per process on request (ARCH_REQ_XCOMP_PERM for XTILEDATA); asked once.
bool amx_usable() {
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) || !(edx & (1u << 25)))
      return false;
#if SL_HAVE_AMX && defined(__linux__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

int64_t host_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return amx_usable() ? kAmx : kVnni;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return kAvx2;
  return kNone;
}

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
// activation quantization

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
// tiles: MB activation rows x 8 (AVX2) or 16 (AVX-512) weight rows; the SIMD lanes are weight rows

SL_AVX2 inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

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
// xp: the group's activations at the chunk's first input, 8 rows per input (the layout tiles_fp's caller writes)
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

// store() for 16 whole columns in vectors: the same float add, and bfloat16 rounded as at::BFloat16 rounds (to nearest
// even, NaN as 0x7FC0), so the outputs equal store()'s; float16 takes store()
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

SL_VNNI inline __m512i bcast4z(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

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

#if SL_HAVE_AMX
// ---------------------------------------------------------------------------------------------
// AMX: 16 activation rows x 16 weight rows per block in one tile product per digit. A block's 32 inputs of 16
// activation rows are an A tile (16 x 32 bytes, row stride K), a block of a weight tile is a B tile as stored
// (bits 8: 8 rows of 4 inputs x 16 weight rows; bits 4 after splitting the nibbles); the int32 sums C (16 x 16)
// go through memory into the same float accumulation as tile_vnni, so the products are bit-identical to it.

// tmm0/1: A, the high/low activation digit; tmm2: B; tmm3/4: C of the two digits
struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// rows: the activation rows of A and C (1..16); fewer rows load and store fewer lines
constexpr TileConfig amx_layout(int rows) {
  TileConfig c{};
  c.palette = 1;
  c.rows[0] = c.rows[1] = static_cast<uint8_t>(rows), c.colsb[0] = c.colsb[1] = 32;
  c.rows[2] = 8, c.colsb[2] = 64;
  c.rows[3] = c.rows[4] = static_cast<uint8_t>(rows), c.colsb[3] = c.colsb[4] = 64;
  return c;
}

constexpr std::array<TileConfig, 16> amx_layouts() {
  std::array<TileConfig, 16> out{};
  for (int r = 0; r < 16; ++r) out[r] = amx_layout(r + 1);
  return out;
}

// in memory, not built on the stack: ldtilecfg's asm tells the compiler it reads 8 bytes, not 64
alignas(64) constexpr std::array<TileConfig, 16> kTileConfigs = amx_layouts();

// the tile intrinsics' asm names no memory it reads: stores the tile loads depend on are fenced with this
inline void compiler_fence() { asm volatile("" ::: "memory"); }

// bits 4: a weight tile's blocks as B tiles (low nibbles of chunk j are inputs 8j..8j+3, high ones 8j+4..8j+7)
SL_AMX void unpack_int4(const uint8_t* wt, int64_t nb, uint8_t* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < 4; ++j) {
      const __m512i raw = _mm512_loadu_si512(wt + b * 256 + j * 64);
      _mm512_storeu_si512(out + b * 512 + j * 128, _mm512_and_si512(raw, m4));
      _mm512_storeu_si512(out + b * 512 + j * 128 + 64, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
    }
}

// blocks whose sums are stored before any is read: reading each block's sums right after its tile store was
// slower (vector loads of a tile store's memory wait for it); 4 measured best of 2, 4, 8, 16 (noisy host)
constexpr int64_t kAmxChunk = 4;

constexpr int64_t kAmxAhead = 4;  // blocks (bits 8: of the weights as stored, tiles one after the other)

// C starts from these zeros: tilezero followed by a product on the same tile costs ~3x a load (measured, SPR)
alignas(64) constexpr int32_t kZeros[16 * 16] = {};

// One block's integer sums for the 16 activation rows from xa (xb: the low digit) into c[0] (c[1]).
template <int BITS, int DIG>
SL_AMX inline void amx_block(const uint8_t* wb, const int8_t* xa, const int8_t* xb, int64_t stride, int32_t* c) {
  _tile_loadd(2, wb, 64);
  _tile_loadd(0, xa, stride);
  _tile_loadd(3, kZeros, 64);
  if (BITS == 4)  // activations signed, codes unsigned, as dpbusd takes them
    _tile_dpbsud(3, 0, 2);
  else  // both signed: the exact sums tile_vnni reaches by flipping the codes' sign bit and taking 128 sum(q) off
    _tile_dpbssd(3, 0, 2);
  if (DIG == 2) {
    _tile_loadd(1, xb, stride);
    _tile_loadd(4, kZeros, 64);
    if (BITS == 4)
      _tile_dpbsud(4, 1, 2);
    else
      _tile_dpbssd(4, 1, 2);
  }
  _tile_stored(3, c, 64);
  if (DIG == 2) _tile_stored(4, c + 256, 64);  // c: [digit][16][16]
}

// MR (<= 16) activation rows from r0 against weight tile t, whose B tiles start at wb (512 bytes per block); the
// tiles are configured for MR rows.
// Software-pipelined by one block: the tile unit works on block b + 1 while the vector units take block b's sums.
template <int MR, int BITS, int DIG>
SL_AMX void tile_amx(const Args& a, int64_t r0, int64_t t, const uint8_t* wb) {
  const uint16_t* dt = a.d + t * a.gd * 16;
  const uint16_t* mt = BITS == 4 ? a.m + t * a.g * 16 : nullptr;
  const int8_t* xa = a.qa + r0 * a.k;
  const int8_t* xb = DIG == 2 ? a.qb + r0 * a.k : nullptr;
  alignas(64) int32_t c[kAmxChunk][DIG][16][16];  // [block][digit][activation row][weight row]
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t gmask = (int64_t{1} << a.gshift) - 1;
  for (int64_t b0 = 0; b0 < a.nb; b0 += kAmxChunk) {
    const int64_t b1 = std::min<int64_t>(a.nb, b0 + kAmxChunk);
    for (int64_t b = b0; b < b1; ++b) {
      if (BITS == 8)  // tile loads wait for L2 where vector loads would not: the weights are fetched ahead
        for (int l = 0; l < 512; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + (b + kAmxAhead) * 512 + l), _MM_HINT_T0);
      amx_block<BITS, DIG>(wb + b * 512, xa + b * 32, DIG == 2 ? xb + b * 32 : nullptr, a.k, &c[b - b0][0][0][0]);
    }
    for (int64_t b = b0; b < b1; ++b) {
      const auto& cb = c[b - b0];
      const __m512 dw =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dt + (b >> a.gdshift) * 16)));
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        __m512i s = _mm512_load_si512(cb[0][r]);
        if (DIG == 2) s = _mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_set1_epi32(254)), _mm512_load_si512(cb[DIG - 1][r]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a.da[(r0 + r) * a.nb + b])),
                                 acc[r]);
      }
      if (BITS == 4 && (b & gmask) == 0) {
        const int64_t g = b >> a.gshift;
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt + g * 16)));
        for (int r = 0; r < MR; ++r) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.sa[(r0 + r) * a.g + g]), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) store16(a, r0 + r, t * 16, acc[r]);
}

template <int BITS, int DIG, int... R>
constexpr auto amx_tiles(std::integer_sequence<int, R...>) {
  return std::array<void (*)(const Args&, int64_t, int64_t, const uint8_t*), sizeof...(R)>{
      &tile_amx<R + 1, BITS, DIG>...};
}

#endif  // SL_HAVE_AMX

// ---------------------------------------------------------------------------------------------
// dispatch over row groups

constexpr int kMB = 4;  // activation rows per tile
constexpr int kAvx2Both = 2;  // AVX2: row groups of up to this many take both halves of a tile in one pass
// From this many rows on AMX beats VNNI (SmolLM2-135M's four layer shapes summed, 1 thread): bits 8 from ~5-6,
// bits 4 from ~10 (VNNI's 4-bit tiles are cheaper; AMX adds the nibbles' unpacking and the min term per row).
constexpr int64_t amx_rows(int64_t bits) { return bits == 4 ? 10 : 6; }

template <int MB, int BITS, int DIG>
void tile(int64_t isa, const Args& a, int64_t r0, int64_t t) {
  if (isa == kVnni) {
    tile_vnni<MB, BITS, DIG>(a, r0, t);
  } else if (MB <= kAvx2Both) {
    tile_avx2<MB, BITS, DIG, 2>(a, r0, t, 0);
  } else {
    tile_avx2<MB, BITS, DIG>(a, r0, t, 0);
    tile_avx2<MB, BITS, DIG>(a, r0, t, 1);
  }
}

// rows [r, rows) of tile t in groups of kMB
template <int BITS, int DIG>
void row_groups(int64_t isa, const Args& a, int64_t r, int64_t rows, int64_t t) {
  for (; r + kMB <= rows; r += kMB) tile<kMB, BITS, DIG>(isa, a, r, t);
  switch (rows - r) {
    case 3: tile<3, BITS, DIG>(isa, a, r, t); break;
    case 2: tile<2, BITS, DIG>(isa, a, r, t); break;
    case 1: tile<1, BITS, DIG>(isa, a, r, t); break;
    default: break;
  }
}

template <int BITS, int DIG>
void tiles(int64_t isa, const Args& a, int64_t rows, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) row_groups<BITS, DIG>(isa, a, 0, rows, t);  // the tile stays in L1 meanwhile
}

// AVX2 4-bit products of 8 rows or more take tile_avx2_fp, in groups of 8 (8 independent sums per weight vector
// hide the FMA latency); a last group of fewer rows is padded with zero rows, so every row is summed the same way
// whatever its group (a sequence's numbers do not depend on its place in a batch). Where the padding would add
// more than a quarter of the rows, the integer path is cheaper (benchmarks/linear_rows.py, AVX2 EPYC: 8 rows
// 504 us against 764, one row 115 us on both).
constexpr bool avx2_fp(int64_t rows) { return rows >= 8 && (rows + 7) / 8 * 8 * 4 <= rows * 5; }

void tiles_fp(const Args& a, int64_t rows, int64_t t0, int64_t t1) {
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

#if SL_HAVE_AMX
// AMX: rows in groups of 16 per weight tile (the tile configured in this worker thread: the configuration is per
// thread, and other code, oneDNN's bf16 kernels, may have loaded its own since the last product)
// A last group of fewer than min_rows rows takes VNNI (a tile product costs the same for 1 row as for 16).
template <int BITS, int DIG>
SL_AMX void tiles_amx(const Args& a, int64_t rows, int64_t t0, int64_t t1, int64_t min_rows) {
  static constexpr auto by_rows = amx_tiles<BITS, DIG>(std::make_integer_sequence<int, 16>{});
  thread_local std::vector<uint8_t> unpacked;
  if (BITS == 4 && static_cast<int64_t>(unpacked.size()) < a.nb * 512) unpacked.resize(a.nb * 512);
  int configured = 0;  // rows of the loaded configuration (ldtilecfg costs ~140 cycles: only when they change)
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wb = a.w + t * a.nb * (BITS == 4 ? 256 : 512);
    if (BITS == 4) {
      unpack_int4(wb, a.nb, unpacked.data());
      compiler_fence();
      wb = unpacked.data();
    }
    for (int64_t r = 0; r < rows; r += 16) {
      const int mr = static_cast<int>(std::min<int64_t>(16, rows - r));
      if (mr < min_rows) {
        row_groups<BITS, DIG>(kVnni, a, r, rows, t);
        break;
      }
      if (mr != configured) _tile_loadconfig(&kTileConfigs[mr - 1]), configured = mr;
      by_rows[mr - 1](a, r, t, wb);
    }
  }
  _tile_release();
}
#endif  // SL_HAVE_AMX

struct Scratch {
  std::vector<int8_t> qa, qb;
  std::vector<float> da, sa, xf;
  std::vector<int32_t> qs;
  void fit(int64_t m, int64_t k, int64_t nb, int64_t g) {
    if (static_cast<int64_t>(qa.size()) < m * k) qa.resize(m * k), qb.resize(m * k);
    if (static_cast<int64_t>(da.size()) < m * nb) da.resize(m * nb), qs.resize(m * nb);
    if (static_cast<int64_t>(sa.size()) < m * g) sa.resize(m * g);
  }
};

template <typename T>
void quantize_rows(const at::Tensor& x, int64_t gshift, int8_t* q, int8_t* qlo, float* d, int32_t* qs, float* s) {
  const T* xp = x.const_data_ptr<T>();
  const int64_t m = x.size(0), k = x.size(1), nb = k / 32, g = nb >> gshift;
  at::parallel_for(0, m, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row<T>(xp + r * k, k, gshift, q + r * k, qlo ? qlo + r * k : nullptr, d + r * nb, qs + r * nb, s + r * g);
  });
}

// x [M, K] as fp32 per group of 8 rows, [K, 8] each (input-major: a tile's broadcasts of 8 rows are adjacent)
template <typename T>
void interleave(const T* x, int64_t m, int64_t k, float* out) {
  for (int64_t r = 0; r < (m + 7) / 8 * 8; ++r)  // the last group's missing rows are zeros
    for (int64_t i = 0; i < k; ++i)
      out[(r / 8) * k * 8 + i * 8 + r % 8] = r < m ? static_cast<float>(x[r * k + i]) : 0.f;
}

at::Tensor qmm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
               int64_t bits, int64_t group, int64_t n, int64_t digits, int64_t isa,
               const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.device().is_cpu() && codes.device().is_cpu(), "specledger qmm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "specledger qmm: x must be a contiguous matrix");
  TORCH_CHECK(bits == 4 || bits == 8, "specledger qmm: bits must be 4 or 8");
  TORCH_CHECK(digits == 1 || digits == 2, "specledger qmm: activations take 1 or 2 int8 digits");
  TORCH_CHECK(group >= 32 && (group & (group - 1)) == 0 && (bits == 4 || group == 32), "specledger qmm: bad group");
  const int64_t hw = host_isa();
  TORCH_CHECK(hw != kNone, "specledger qmm: this CPU lacks AVX2/FMA/F16C");
  const int64_t m = x.size(0), k = x.size(1), nb = k / 32, tiles_n = codes.size(0);
  int64_t gshift = 0;
  while ((int64_t{32} << gshift) < group) ++gshift;
  const int64_t g = nb >> gshift;
  // isa 0: the best for this many rows (AMX's tile products pay from amx_rows on); 3: AMX for every row
  const int64_t amx_min_rows = isa == kNone ? amx_rows(bits) : 1;
  if (isa == kNone)
    isa = hw == kAmx && m < amx_min_rows ? kVnni : hw;
  else if (isa > hw)
    isa = hw;
  TORCH_CHECK(k % group == 0 && codes.dim() == 3 && codes.size(1) == nb && codes.size(2) == (bits == 4 ? 256 : 512) &&
                  tiles_n * 16 >= n && codes.is_contiguous(),
              "specledger qmm: codes do not match the input width");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == tiles_n && scales.size(1) == (bits == 4 ? g : nb) && scales.size(2) == 16,
              "specledger qmm: scales layout");
  if (bits == 4)
    TORCH_CHECK(mins.scalar_type() == at::kHalf && mins.is_contiguous() && mins.sizes() == scales.sizes(),
                "specledger qmm: mins layout");
  // the quantized activations live in this thread's scratch (no allocator calls per product: a decode step
  // makes ~120 of them); the parallel workers below only write disjoint rows of it
  thread_local Scratch scratch;
  scratch.fit(m, k, nb, g);
  int8_t* qp = scratch.qa.data();
  int8_t* qbp = digits == 2 ? scratch.qb.data() : nullptr;
  float *dp = scratch.da.data(), *sp = scratch.sa.data();
  int32_t* qsp = scratch.qs.data();
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "specledger qmm: x must be float32, bfloat16 or float16");
  const bool fp = bits == 4 && isa == kAvx2 && avx2_fp(m);
  if (fp) {
    const int64_t padded = (m + 7) / 8 * 8 * k;
    if (static_cast<int64_t>(scratch.xf.size()) < padded) scratch.xf.resize(padded);
    switch (x.scalar_type()) {
      case at::kFloat: interleave(x.const_data_ptr<float>(), m, k, scratch.xf.data()); break;
      case at::kBFloat16: interleave(x.const_data_ptr<at::BFloat16>(), m, k, scratch.xf.data()); break;
      default: interleave(x.const_data_ptr<at::Half>(), m, k, scratch.xf.data()); break;
    }
  } else {
    switch (x.scalar_type()) {
      case at::kFloat: quantize_rows<float>(x, gshift, qp, qbp, dp, qsp, sp); break;
      case at::kBFloat16: quantize_rows<at::BFloat16>(x, gshift, qp, qbp, dp, qsp, sp); break;
      default: quantize_rows<at::Half>(x, gshift, qp, qbp, dp, qsp, sp); break;
    }
  }
  // with a residual r (float32 [M, N]): y = r + x W^T in float32, the residual stream's add fused in
  const bool has_res = residual.has_value() && residual->defined();
  if (has_res)
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->is_contiguous() && residual->numel() == m * n,
                "specledger qmm: residual must be a contiguous float32 [M, N]");
  at::Tensor y = at::empty({m, n}, has_res ? x.options().dtype(at::kFloat) : x.options());
  const int64_t out_kind = x.scalar_type() == at::kBFloat16 ? 1 : x.scalar_type() == at::kHalf ? 2 : 0;
  const Args a{static_cast<const uint8_t*>(codes.const_data_ptr()),
               static_cast<const uint16_t*>(scales.const_data_ptr()),
               bits == 4 ? static_cast<const uint16_t*>(mins.const_data_ptr()) : nullptr,
               qp, qbp, dp, sp, qsp, fp ? scratch.xf.data() : nullptr, y.data_ptr(), has_res ? residual->const_data_ptr<float>() : nullptr, out_kind,
               k, nb, g, gshift, bits == 4 ? g : nb, bits == 4 ? gshift : 0, n};
  // one chunk of tiles per thread (a tile is 16 weight rows)
  const int64_t threads = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(1, (tiles_n + threads - 1) / threads);
  at::parallel_for(0, tiles_n, grain, [&](int64_t t0, int64_t t1) {
#if SL_HAVE_AMX
    if (isa == kAmx) {
      if (bits == 4)
        digits == 2 ? tiles_amx<4, 2>(a, m, t0, t1, amx_min_rows) : tiles_amx<4, 1>(a, m, t0, t1, amx_min_rows);
      else
        digits == 2 ? tiles_amx<8, 2>(a, m, t0, t1, amx_min_rows) : tiles_amx<8, 1>(a, m, t0, t1, amx_min_rows);
      return;
    }
#endif
    if (fp)
      tiles_fp(a, m, t0, t1);
    else if (bits == 4)
      digits == 2 ? tiles<4, 2>(isa, a, m, t0, t1) : tiles<4, 1>(isa, a, m, t0, t1);
    else
      digits == 2 ? tiles<8, 2>(isa, a, m, t0, t1) : tiles<8, 1>(isa, a, m, t0, t1);
  });
  return y;
}

int64_t qmm_isa() { return host_isa(); }

}  // namespace

TORCH_LIBRARY(specledger, lib) {
  lib.def("qmm(Tensor x, Tensor codes, Tensor scales, Tensor mins, int bits, int group, int n, int digits, int isa, "
          "Tensor? residual=None) -> Tensor");
  lib.def("qmm_isa() -> int", &qmm_isa);
}

TORCH_LIBRARY_IMPL(specledger, CPU, lib) { lib.impl("qmm", &qmm); }
