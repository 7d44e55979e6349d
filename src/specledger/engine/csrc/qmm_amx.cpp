// The AMX-INT8 path of the quantized products (qmm_common.h: the layout, the operands; qmm.cpp chooses the path).
// 16 activation rows x 16 weight rows per block in one tile product per digit. A block's 32 inputs of 16
// activation rows are an A tile (16 x 32 bytes, row stride K), a block of a weight tile is a B tile as stored
// (bits 8: 8 rows of 4 inputs x 16 weight rows; bits 4 after splitting the nibbles); the int32 sums C (16 x 16)
// go through memory into the same float accumulation as tile_vnni, so the products are bit-identical to it.
// Compiled empty where the compiler lacks the AMX intrinsics (SL_HAVE_AMX 0: VNNI at most).

#include "qmm_common.h"

#if SL_HAVE_AMX

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace specledger_qmm {
namespace {

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
constexpr auto amx_tile_table(std::integer_sequence<int, R...>) {
  return std::array<void (*)(const Args&, int64_t, int64_t, const uint8_t*), sizeof...(R)>{
      &tile_amx<R + 1, BITS, DIG>...};
}

// AMX: rows in groups of 16 per weight tile (the tile configured in this worker thread: the configuration is per
// thread, and other code, oneDNN's bf16 kernels, may have loaded its own since the last product)
// A last group of fewer than min_rows rows takes VNNI (a tile product costs the same for 1 row as for 16).
template <int BITS, int DIG>
SL_AMX void amx_tiles_of(const Args& a, int64_t rows, int64_t t0, int64_t t1, int64_t min_rows) {
  static constexpr auto by_rows = amx_tile_table<BITS, DIG>(std::make_integer_sequence<int, 16>{});
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
        vnni_tiles(a, BITS, DIG, r, rows, t, t + 1);
        break;
      }
      if (mr != configured) _tile_loadconfig(&kTileConfigs[mr - 1]), configured = mr;
      by_rows[mr - 1](a, r, t, wb);
    }
  }
  _tile_release();
}

}  // namespace

void amx_tiles(const Args& a, int64_t bits, int64_t digits, int64_t rows, int64_t t0, int64_t t1, int64_t min_rows) {
  if (bits == 4)
    digits == 2 ? amx_tiles_of<4, 2>(a, rows, t0, t1, min_rows) : amx_tiles_of<4, 1>(a, rows, t0, t1, min_rows);
  else
    digits == 2 ? amx_tiles_of<8, 2>(a, rows, t0, t1, min_rows) : amx_tiles_of<8, 1>(a, rows, t0, t1, min_rows);
}

}  // namespace specledger_qmm

#endif  // SL_HAVE_AMX
