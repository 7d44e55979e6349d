// Fused CPU ops for a decode step, where PyTorch's eager ops cost more in dispatch and small-shape setup
// than in arithmetic (benchmarks/decode_step.py's "rest"): RMSNorm with its cast, one-query attention
// over the KV cache, SwiGLU, RoPE. Built with qmm.cpp into the same library (engine/qkernel.py); engine/cpu_ops.py
// chooses them on CPU when the library is loaded and falls back to the PyTorch expressions otherwise.
// decode_layer chains them with qmm.cpp's products into one call per layer for a single new token.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <immintrin.h>

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using specledger_simd::hsum;

// e^x for x <= 88: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p the degree-6 Taylor polynomial (relative
// error ~1e-7, under float32's rounding of the result); very negative x give 0.
SL_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.f)), _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

using specledger_simd::load8;

template <typename T>
SL_AVX2 inline void store8(T* p, __m256 v);
template <>
SL_AVX2 inline void store8<float>(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
template <>
SL_AVX2 inline void store8<at::BFloat16>(at::BFloat16* p, __m256 v) {
  // round to nearest even, as c10::BFloat16(float) does (the engine's activations are finite)
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
template <>
SL_AVX2 inline void store8<at::Half>(at::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <typename T>
inline float ld(const T* p) { return static_cast<float>(*p); }

template <typename T>
inline void st(T* p, float v) { *p = T(v); }

inline bool avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// --- RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, fp32 in, the compute dtype out ----------------------

template <typename T>
SL_AVX2 void rms_row(const float* x, const float* w, int64_t n, float eps, T* y) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= n; i += 8)
    store8<T>(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) st<T>(y + i, x[i] * r * w[i]);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::ScalarType out) {
  TORCH_CHECK(avx2(), "specledger rms_norm: AVX2 required");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.is_contiguous() && w.is_contiguous(),
              "specledger rms_norm: fp32 contiguous x and weight");
  const int64_t n = x.size(-1), rows = x.numel() / n;
  TORCH_CHECK(w.numel() == n, "specledger rms_norm: weight size");
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(out));
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (out == at::kBFloat16)
        rms_row(xp + r * n, wp, n, static_cast<float>(eps), y.data_ptr<at::BFloat16>() + r * n);
      else if (out == at::kHalf)
        rms_row(xp + r * n, wp, n, static_cast<float>(eps), y.data_ptr<at::Half>() + r * n);
      else
        rms_row(xp + r * n, wp, n, static_cast<float>(eps), y.data_ptr<float>() + r * n);
    }
  });
  return y;
}

// --- one query per sequence over the cache -------------------------------------------------------------
// q (B, H, D) fp32, k/v (B, KV, S, D) fp32 with unit stride in D; lengths (B) int64 (entries per sequence,
// <= S) or empty (all S). Heads are grouped onto their KV head (GQA): each key is loaded once per group.
// Output (B, H, D) in out dtype.

// Eight dot products' partial vectors -> one vector of their eight sums.
SL_AVX2 inline __m256 hsum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// out[c] (c < NC vectors of 8) += sum over s of p[s] * v[s][c]; the cache KT is fp32 or bf16 (read as fp32). Called
// once per block of keys: the sums carried in `out` between blocks add in the same order as one pass would.
template <int NC, typename KT>
SL_AVX2 inline void weighted_sum(const float* p, const KT* v, int64_t s_stride, int64_t len, float* out) {
  __m256 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_loadu_ps(out + 8 * c);
  for (int64_t s = 0; s < len; ++s) {
    const __m256 w = _mm256_set1_ps(p[s]);
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_fmadd_ps(w, load8<KT>(v + s * s_stride + 8 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

// Keys per block: every query head of a group reads a block's K (then V) rows while they are in L1 (32 rows of
// 128 bf16 = 8 KB), so a long cache is read from memory once per group, not once per query head (Qwen2.5 1.5B: 6).
constexpr int64_t KEY_BLOCK = 32;
// A bf16 cache's block is converted to fp32 once for all the group's query heads (each would convert it again),
// for head sizes up to this (a 32 KB buffer on the stack).
constexpr int64_t STAGE_D = 256;

template <typename KT>
SL_AVX2 const float* staged(const KT* x, int64_t stride, int64_t n, int64_t d, float* buf) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; j += 8) _mm256_storeu_ps(buf + r * d + j, load8<KT>(x + r * stride + j));
  return buf;
}

// scores[h * len + s0 + i] for the block's n keys (rows of kb, ks apart) and each of the nh query heads
template <typename ET>
SL_AVX2 void block_scores(const float* q, int64_t qs_h, int64_t nh, const ET* kb, int64_t ks, int64_t s0, int64_t n,
                          int64_t d, float* scores, int64_t len) {
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (int64_t h = 0; h < nh; ++h) {
    const float* qh = q + h * qs_h;
    float* sc = scores + h * len + s0;
    int64_t s = 0;
    for (; s + 8 <= n; s += 8) {  // eight keys at a time: no horizontal sum per key
      __m256 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + i);
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, load8<ET>(kb + (s + j) * ks + i), a[j]);
      }
      _mm256_storeu_ps(sc + s, _mm256_mul_ps(hsum8x8(a), _mm256_set1_ps(scale)));
    }
    for (; s < n; ++s) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), load8<ET>(kb + s * ks + i), acc);
      sc[s] = hsum(acc) * scale;
    }
  }
}

// out[h] += the block's n value rows (vb, vs apart) weighted by each head's probabilities
template <typename ET>
SL_AVX2 void block_values(const float* scores, int64_t len, int64_t nh, const ET* vb, int64_t vs, int64_t s0, int64_t n,
                          int64_t d, float* out) {
  for (int64_t h = 0; h < nh; ++h) {
    const float* p = scores + h * len + s0;
    float* oh = out + h * d;
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) weighted_sum<8, ET>(p, vb + c, vs, n, oh + c);
    for (; c < d; c += 8) weighted_sum<1, ET>(p, vb + c, vs, n, oh + c);
  }
}

// allow: nullptr, or len flags (1 = may attend): a draft tree's row sees the cache and its own ancestors only.
template <typename KT>
SL_AVX2 void attend_group(const float* q, int64_t qs_h, int64_t nh, const KT* k, const KT* v, int64_t s_stride,
                          int64_t len, int64_t d, float* scores, float* out, const uint8_t* allow = nullptr) {
  constexpr bool convert = !std::is_same_v<KT, float>;
  alignas(64) float buf[convert ? KEY_BLOCK * STAGE_D : 1];
  const bool stage = convert && nh > 1 && d <= STAGE_D;
  for (int64_t s0 = 0; s0 < len; s0 += KEY_BLOCK) {
    const int64_t n = std::min(len, s0 + KEY_BLOCK) - s0;
    if (stage) block_scores<float>(q, qs_h, nh, staged(k + s0 * s_stride, s_stride, n, d, buf), d, s0, n, d, scores, len);
    else block_scores<KT>(q, qs_h, nh, k + s0 * s_stride, s_stride, s0, n, d, scores, len);
  }
  for (int64_t h = 0; h < nh; ++h) {
    float* sc = scores + h * len;
    int64_t s;
    if (allow)
      for (s = 0; s < len; ++s)
        if (!allow[s]) sc[s] = -INFINITY;  // (exp8 clamps: e^-87, nothing beside the row's largest e^0)
    float mx = -INFINITY;
    for (s = 0; s < len; ++s) mx = sc[s] > mx ? sc[s] : mx;
    float sum = 0.f;
    s = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; s + 8 <= len; s += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + s), _mm256_set1_ps(mx)));
      _mm256_storeu_ps(sc + s, e);
      acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
    for (; s < len; ++s) {
      sc[s] = std::exp(sc[s] - mx);
      sum += sc[s];
    }
    const float inv = 1.f / sum;
    for (s = 0; s < len; ++s) sc[s] *= inv;
    std::fill(out + h * d, out + (h + 1) * d, 0.f);
  }
  for (int64_t s0 = 0; s0 < len; s0 += KEY_BLOCK) {
    const int64_t n = std::min(len, s0 + KEY_BLOCK) - s0;
    if (stage) block_values<float>(scores, len, nh, staged(v + s0 * s_stride, s_stride, n, d, buf), d, s0, n, d, out);
    else block_values<KT>(scores, len, nh, v + s0 * s_stride, s_stride, s0, n, d, out);
  }
}

// q (R, H, D) fp32, one query per row; k, v (B, KV, S, D) fp32 or bf16. Row r attends the first lengths[r] entries (all
// S where lengths is empty) of sequence slots[r] (r itself where slots is empty), of those only the ones that
// allow[r] flags where allow (R, >= max length) is given: decode rows, draft chains and draft trees of many
// sequences in one call, each against its own slot of the cache.
template <typename KT>
void attend_rows(const at::Tensor& q, const KT* kp, const KT* vp, const at::Tensor& k, const int64_t* lp,
                 const int64_t* sp, const uint8_t* ap, const at::Tensor& allow, at::Tensor& o) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2), kv = k.size(1), s = k.size(2), g = h / kv;
  const float* qp = q.const_data_ptr<float>();
  float* op = o.data_ptr<float>();
  at::parallel_for(0, b * kv, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(g * s);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t bi = i / kv, j = i % kv, si = sp ? sp[bi] : bi;
      const int64_t len = lp ? std::min<int64_t>(std::max<int64_t>(lp[bi], 1), s) : s;
      attend_group<KT>(qp + bi * q.stride(0) + j * g * q.stride(1), q.stride(1), g,
                       kp + si * k.stride(0) + j * k.stride(1), vp + si * k.stride(0) + j * k.stride(1), k.stride(2),
                       len, d, scores.data(), op + (bi * h + j * g) * d, ap ? ap + bi * allow.stride(0) : nullptr);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
                            const at::Tensor& slots, const at::Tensor& allow, at::ScalarType out) {
  TORCH_CHECK(avx2(), "specledger decode_attention: AVX2 required");
  TORCH_CHECK(q.scalar_type() == at::kFloat && (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16) &&
                  v.scalar_type() == k.scalar_type(),
              "specledger decode_attention: fp32 q, fp32 or bf16 k and v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes() && (slots.numel() || q.size(0) == k.size(0)) &&
                  q.size(2) == k.size(3) && q.size(1) % k.size(1) == 0 && k.size(3) % 8 == 0,
              "specledger decode_attention: shapes");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && k.strides() == v.strides(),
              "specledger decode_attention: unit stride in D");
  const int64_t b = q.size(0), s = k.size(2);
  const int64_t* lp = nullptr;
  if (lengths.numel()) {
    TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.numel() == b && lengths.is_contiguous(),
                "specledger decode_attention: lengths");
    lp = lengths.const_data_ptr<int64_t>();
  }
  const int64_t* sp = nullptr;
  if (slots.numel()) {
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == b && slots.is_contiguous(),
                "specledger decode_attention: slots");
    sp = slots.const_data_ptr<int64_t>();
    for (int64_t r = 0; r < b; ++r)
      TORCH_CHECK(sp[r] >= 0 && sp[r] < k.size(0), "specledger decode_attention: slot out of range");
  }
  const uint8_t* ap = nullptr;
  if (allow.numel()) {
    TORCH_CHECK((allow.scalar_type() == at::kBool || allow.scalar_type() == at::kByte) && allow.dim() == 2 &&
                    allow.size(0) == b && allow.size(1) >= s && allow.stride(1) == 1,
                "specledger decode_attention: allow (R, >= S) bool");
    ap = static_cast<const uint8_t*>(allow.const_data_ptr());
  }
  at::Tensor o = at::empty(q.sizes(), q.options());
  if (k.scalar_type() == at::kBFloat16)
    attend_rows(q, k.const_data_ptr<at::BFloat16>(), v.const_data_ptr<at::BFloat16>(), k, lp, sp, ap, allow, o);
  else
    attend_rows(q, k.const_data_ptr<float>(), v.const_data_ptr<float>(), k, lp, sp, ap, allow, o);
  return out == at::kFloat ? o : o.to(out);
}

// --- SwiGLU: silu(gate) * up of a fused [gate | up] projection ----------------------------------------

template <typename T>
SL_AVX2 void swiglu_rows(const T* x, int64_t rows, int64_t inter, T* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = x + r * 2 * inter;
    const T* u = g + inter;
    T* o = y + r * inter;
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
      const __m256 gv = load8<T>(g + i);
      const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
      store8<T>(o + i, _mm256_mul_ps(sg, load8<T>(u + i)));
    }
    for (; i < inter; ++i) {
      const float gf = ld(g + i);
      st(o + i, gf / (1.f + std::exp(-gf)) * ld(u + i));
    }
  }
}

at::Tensor swiglu(const at::Tensor& x) {
  TORCH_CHECK(avx2(), "specledger swiglu: AVX2 required");
  TORCH_CHECK(x.is_contiguous() && x.size(-1) % 2 == 0, "specledger swiglu: contiguous [.., 2 I] input");
  const int64_t inter = x.size(-1) / 2, rows = x.numel() / x.size(-1);
  auto sizes = x.sizes().vec();
  sizes.back() = inter;
  at::Tensor y = at::empty(sizes, x.options());
  at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    switch (x.scalar_type()) {
      case at::kFloat: swiglu_rows(x.const_data_ptr<float>() + r0 * 2 * inter, r1 - r0, inter, y.data_ptr<float>() + r0 * inter); break;
      case at::kBFloat16: swiglu_rows(x.const_data_ptr<at::BFloat16>() + r0 * 2 * inter, r1 - r0, inter, y.data_ptr<at::BFloat16>() + r0 * inter); break;
      case at::kHalf: swiglu_rows(x.const_data_ptr<at::Half>() + r0 * 2 * inter, r1 - r0, inter, y.data_ptr<at::Half>() + r0 * inter); break;
      default: TORCH_CHECK(false, "specledger swiglu: float32, bfloat16 or float16");
    }
  });
  return y;
}

// --- one new token per sequence, end to end: RoPE on q and k, k and v into the cache, attention --------
// qkv (B, 1, (H + 2 KV) D) contiguous in the compute dtype (the fused projection's output), cos/sin (B or 1, 1,
// 1, D) in that dtype, caches (B, KV, S, D) fp32 (or bf16) with unit stride in D; the token goes to slot `start` and
// attends to [0, start]. Returns (B, 1, H D) in `out`. Replaces ~25 small eager ops per layer.

template <typename T>
SL_AVX2 void rope_into(const T* x, const T* c, const T* sn, int64_t d, float* o) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; j += 8) {
    const __m256 lo = load8<T>(x + j), hi = load8<T>(x + half + j);
    _mm256_storeu_ps(o + j, _mm256_fmadd_ps(hi, load8<T>(sn + j), _mm256_mul_ps(lo, load8<T>(c + j))));
    _mm256_storeu_ps(o + half + j, _mm256_fmadd_ps(lo, load8<T>(sn + half + j), _mm256_mul_ps(hi, load8<T>(c + half + j))));
  }
}

template <typename T, typename KT>
SL_AVX2 void copy_into(const T* x, int64_t d, KT* o) {
  for (int64_t j = 0; j < d; j += 8) store8<KT>(o + j, load8<T>(x + j));
}

// One KV head j of one sequence: RoPE on its g = h / kv query heads and its k, k and v into the cache, those query
// heads' attention over [0, start]. The cache KT is fp32 or bf16; a bf16 cache holds k rounded to bf16 after RoPE
// (as the op-by-op path stores it).
template <typename T, typename O, typename KT>
SL_AVX2 void new_token_group(const T* qkv, const T* c, const T* sn, int64_t h, int64_t kv, int64_t j, int64_t d, KT* kc,
                             KT* vc, int64_t hstride, int64_t sstride, int64_t start, float* qbuf, float* scores,
                             float* obuf, O* y) {
  const int64_t g = h / kv;
  for (int64_t i = 0; i < g; ++i) rope_into<T>(qkv + (j * g + i) * d, c, sn, d, qbuf + i * d);
  KT* kj = kc + j * hstride;
  KT* vj = vc + j * hstride;
  if constexpr (std::is_same_v<KT, float>) {
    rope_into<T>(qkv + (h + j) * d, c, sn, d, kj + start * sstride);
  } else {  // through obuf (free until attention writes it)
    rope_into<T>(qkv + (h + j) * d, c, sn, d, obuf);
    copy_into<float, KT>(obuf, d, kj + start * sstride);
  }
  copy_into<T, KT>(qkv + (h + kv + j) * d, d, vj + start * sstride);
  attend_group<KT>(qbuf, d, g, kj, vj, sstride, start + 1, d, scores, obuf);
  y += j * g * d;
  int64_t i = 0;
  for (; i + 8 <= g * d; i += 8) store8<O>(y + i, _mm256_loadu_ps(obuf + i));
  for (; i < g * d; ++i) st<O>(y + i, obuf[i]);
}

// Cached positions from which one sequence's KV heads attend on threads of their own (a long context: the cache
// read dominates); below, a sequence is one task, as a thread's start-up costs more than its share of the reads.
constexpr int64_t SPLIT_HEADS_FROM = 256;

template <typename T, typename O, typename KT>
void new_token_all(const at::Tensor& qkv, const at::Tensor& c, const at::Tensor& sn, at::Tensor& kc, at::Tensor& vc,
                   int64_t start, int64_t h, at::Tensor& y) {
  const int64_t b = qkv.size(0), kv = kc.size(1), d = kc.size(3), width = qkv.size(2), g = h / kv;
  const int64_t cb = c.size(0) == 1 ? 0 : c.stride(0);
  at::parallel_for(0, b * kv, start >= SPLIT_HEADS_FROM ? 1 : kv, [&](int64_t i0, int64_t i1) {
    std::vector<float> qbuf(g * d), obuf(g * d), scores(g * (start + 1));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t bi = i / kv;
      new_token_group<T, O, KT>(qkv.const_data_ptr<T>() + bi * width, c.const_data_ptr<T>() + bi * cb,
                                sn.const_data_ptr<T>() + bi * cb, h, kv, i % kv, d, kc.data_ptr<KT>() + bi * kc.stride(0),
                                vc.data_ptr<KT>() + bi * vc.stride(0), kc.stride(1), kc.stride(2), start, qbuf.data(),
                                scores.data(), obuf.data(), y.data_ptr<O>() + bi * h * d);
    }
  });
}

at::Tensor attend_new_token(const at::Tensor& qkv, const at::Tensor& c, const at::Tensor& sn, at::Tensor kc,
                            at::Tensor vc, int64_t start, int64_t h, at::ScalarType out) {
  TORCH_CHECK(avx2(), "specledger attend_new_token: AVX2 required");
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(1) == 1 && qkv.is_contiguous() && kc.dim() == 4 && vc.sizes() == kc.sizes() &&
                  kc.strides() == vc.strides() && kc.size(0) == qkv.size(0) && kc.stride(3) == 1,
              "specledger attend_new_token: shapes");
  const int64_t b = qkv.size(0), kv = kc.size(1), d = kc.size(3);
  TORCH_CHECK(h % kv == 0 && d % 16 == 0 && qkv.size(2) == (h + 2 * kv) * d && start >= 0 && start < kc.size(2),
              "specledger attend_new_token: widths or position");
  TORCH_CHECK((kc.scalar_type() == at::kFloat || kc.scalar_type() == at::kBFloat16) && vc.scalar_type() == kc.scalar_type() &&
                  c.scalar_type() == qkv.scalar_type() &&
                  sn.scalar_type() == qkv.scalar_type() && c.is_contiguous() && sn.is_contiguous() &&
                  c.numel() == (c.size(0)) * d && sn.sizes() == c.sizes() && (c.size(0) == 1 || c.size(0) == b),
              "specledger attend_new_token: dtypes or rope tables");
  at::Tensor y = at::empty({b, 1, h * d}, qkv.options().dtype(out));
#define SL_NT(T, O) new_token_all<T, O, float>(qkv, c, sn, kc, vc, start, h, y)
  const auto in = qkv.scalar_type();
  if (kc.scalar_type() == at::kBFloat16) {  // a bf16 model's cache on a CPU that computes in bf16 (model.kv_dtype)
    TORCH_CHECK(in == at::kBFloat16 && out == at::kBFloat16, "specledger attend_new_token: a bf16 cache takes bf16 in and out");
    new_token_all<at::BFloat16, at::BFloat16, at::BFloat16>(qkv, c, sn, kc, vc, start, h, y);
  } else if (in == at::kBFloat16 && out == at::kBFloat16) SL_NT(at::BFloat16, at::BFloat16);
  else if (in == at::kFloat && out == at::kFloat) SL_NT(float, float);
  else if (in == at::kHalf && out == at::kHalf) SL_NT(at::Half, at::Half);
  else if (in == at::kBFloat16 && out == at::kFloat) SL_NT(at::BFloat16, float);
  else TORCH_CHECK(false, "specledger attend_new_token: unsupported dtype pair");
#undef SL_NT
  return y;
}

// --- RoPE in the rotate-half form with sign-folded sin (model.py's rope_tables) --------------------------
// out[i] = x[i] cos[i] + x[i +- D/2] sin[i], in float32, rounded once; x (B, n, heads, D) with unit stride
// in D (a view of the fused QKV projection), cos/sin (B or 1, n, 1, D); out contiguous in x's dtype.

template <typename T>
SL_AVX2 void rope_span(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, at::Tensor& out, int64_t i0,
                       int64_t i1) {
  const int64_t n = x.size(1), nh = x.size(2), d = x.size(3), half = d / 2;
  const T* xp = x.const_data_ptr<T>();
  const T* cp = c.const_data_ptr<T>();
  const T* sp = sn.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t cb = c.size(0) == 1 ? 0 : c.stride(0), sb = sn.size(0) == 1 ? 0 : sn.stride(0);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t bi = i / n, t = i % n;
    const T* cr = cp + bi * cb + t * c.stride(1);
    const T* sr = sp + bi * sb + t * sn.stride(1);
    for (int64_t h = 0; h < nh; ++h) {
      const T* xr = xp + bi * x.stride(0) + t * x.stride(1) + h * x.stride(2);
      T* o = op + ((bi * n + t) * nh + h) * d;
      for (int64_t j = 0; j < half; j += 8) {
        const __m256 lo = load8<T>(xr + j), hi = load8<T>(xr + half + j);
        store8<T>(o + j, _mm256_fmadd_ps(hi, load8<T>(sr + j), _mm256_mul_ps(lo, load8<T>(cr + j))));
        store8<T>(o + half + j, _mm256_fmadd_ps(lo, load8<T>(sr + half + j), _mm256_mul_ps(hi, load8<T>(cr + half + j))));
      }
    }
  }
}

template <typename T>
void rope_rows(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, at::Tensor& out) {
  at::parallel_for(0, x.size(0) * x.size(1), 16, [&](int64_t i0, int64_t i1) { rope_span<T>(x, c, sn, out, i0, i1); });
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn) {
  TORCH_CHECK(avx2(), "specledger rope: AVX2 required");
  TORCH_CHECK(x.dim() == 4 && c.dim() == 4 && c.sizes() == sn.sizes() && c.size(1) == x.size(1) && c.size(3) == x.size(3) &&
                  (c.size(0) == 1 || c.size(0) == x.size(0)) && x.size(3) % 16 == 0,
              "specledger rope: shapes");
  TORCH_CHECK(x.stride(3) == 1 && c.stride(3) == 1 && sn.stride(3) == 1 && c.strides() == sn.strides(),
              "specledger rope: unit stride in D");
  TORCH_CHECK(c.scalar_type() == x.scalar_type() && sn.scalar_type() == x.scalar_type(), "specledger rope: dtypes");
  at::Tensor out = at::empty(x.sizes(), x.options());
  switch (x.scalar_type()) {
    case at::kFloat: rope_rows<float>(x, c, sn, out); break;
    case at::kBFloat16: rope_rows<at::BFloat16>(x, c, sn, out); break;
    case at::kHalf: rope_rows<at::Half>(x, c, sn, out); break;
    default: TORCH_CHECK(false, "specledger rope: float32, bfloat16 or float16");
  }
  return out;
}

// --- a whole decoder layer for one new token ------------------------------------------------------------
// The same ops in the same order as model.py's Block for one token with quantized weights (RMSNorm, the fused
// QKV product, attend_new_token, the output product with the residual add, RMSNorm, the gate|up product, SwiGLU,
// the down product with the residual add), so the result is bit-identical; one call instead of eight, each of
// which costs ~10 us of Python and dispatch on a CPU step of ~10 ms of arithmetic. x (1, 1, hidden) fp32, the
// residual stream; codes/scales/mins: the four products' qmm layouts (wqkv, wo, w13, w2); meta: per product
// (bits, group, n, digits, isa). Returns the new residual stream (1, 1, hidden) fp32.

using QmmFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                         int64_t, int64_t, int64_t, const std::optional<at::Tensor>&);

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2, double eps,
                        at::TensorList codes, at::TensorList scales, at::TensorList mins, at::IntArrayRef meta,
                        const at::Tensor& c, const at::Tensor& sn, at::Tensor kc, at::Tensor vc, int64_t start,
                        int64_t h, at::ScalarType act, const std::optional<at::Tensor>& qkv_bias) {
  static const auto qmm = c10::Dispatcher::singleton().findSchemaOrThrow("specledger::qmm", "").typed<QmmFn>();
  TORCH_CHECK(codes.size() == 4 && scales.size() == 4 && mins.size() == 4 && meta.size() == 20,
              "specledger decode_layer: four products and five ints for each");
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1 && x.size(1) == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "specledger decode_layer: x must be a contiguous fp32 (1, 1, hidden)");
  const auto product = [&](int i, const at::Tensor& in, const std::optional<at::Tensor>& residual) {
    const int64_t* m = meta.data() + 5 * i;
    return qmm.call(in, codes[i], scales[i], mins[i], m[0], m[1], m[2], m[3], m[4], residual);
  };
  const int64_t hidden = x.size(2);
  at::Tensor r = x.view({1, hidden});
  at::Tensor qkv = product(0, rms_norm(r, norm1, eps, act), std::nullopt);
  if (qkv_bias.has_value() && qkv_bias->defined()) qkv.add_(*qkv_bias);  // Qwen2: as Attention.project adds it
  at::Tensor y = attend_new_token(qkv.view({1, 1, qkv.size(1)}), c, sn, kc, vc, start, h, act);
  r = product(1, y.view({1, y.size(2)}), r);
  r = product(3, swiglu(product(2, rms_norm(r, norm2, eps, act), std::nullopt)), r);
  return r.view({1, 1, hidden});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specledger, lib) {
  lib.def("rms_norm(Tensor x, Tensor weight, float eps, ScalarType out) -> Tensor");
  lib.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor lengths, Tensor slots, Tensor allow, ScalarType out) -> Tensor");
  lib.def("swiglu(Tensor x) -> Tensor");
  lib.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  lib.def("attend_new_token(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, int start, "
          "int n_heads, ScalarType out) -> Tensor");
  lib.def("decode_layer(Tensor x, Tensor norm1, Tensor norm2, float eps, Tensor[] codes, Tensor[] scales, "
          "Tensor[] mins, int[] meta, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, int start, "
          "int n_heads, ScalarType act, Tensor? qkv_bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(specledger, CPU, lib) {
  lib.impl("rms_norm", &rms_norm);
  lib.impl("decode_attention", &decode_attention);
  lib.impl("swiglu", &swiglu);
  lib.impl("rope", &rope);
  lib.impl("attend_new_token", &attend_new_token);
  lib.impl("decode_layer", &decode_layer);
}
