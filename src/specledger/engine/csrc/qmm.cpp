// The quantized-product op (torch.ops.specledger.qmm): checks, the activations' quantization, and the choice of
// instruction-set path for each product. The paths are one file each (qmm_avx2.cpp, qmm_vnni.cpp, qmm_amx.cpp),
// the layout and what they share in qmm_common.h; engine/qkernel.py builds them into one library.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "qmm_common.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

using namespace specledger_qmm;

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

// From this many rows on AMX beats VNNI (SmolLM2-135M's four layer shapes summed, 1 thread): bits 8 from ~5-6,
// bits 4 from ~10 (VNNI's 4-bit tiles are cheaper; AMX adds the nibbles' unpacking and the min term per row).
constexpr int64_t amx_rows(int64_t bits) { return bits == 4 ? 10 : 6; }

// AVX2 4-bit products of 8 rows or more take tile_avx2_fp, in groups of 8 (8 independent sums per weight vector
// hide the FMA latency); a last group of fewer rows is padded with zero rows, so every row is summed the same way
// whatever its group (a sequence's numbers do not depend on its place in a batch). Where the padding would add
// more than a quarter of the rows, the integer path is cheaper (benchmarks/linear_rows.py, AVX2 EPYC: 8 rows
// 504 us against 764, one row 115 us on both).
constexpr bool avx2_fp(int64_t rows) { return rows >= 8 && (rows + 7) / 8 * 8 * 4 <= rows * 5; }

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
    avx2_fp_activations(x, scratch.xf.data());
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
      amx_tiles(a, bits, digits, m, t0, t1, amx_min_rows);
      return;
    }
#endif
    if (fp)
      avx2_fp_tiles(a, m, t0, t1);
    else if (isa == kVnni)
      vnni_tiles(a, bits, digits, 0, m, t0, t1);
    else
      avx2_tiles(a, bits, digits, 0, m, t0, t1);
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
