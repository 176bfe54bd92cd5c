// Matmuls on weights kept in GGUF's Q8_0 blocks (32 int8 values and one scale per
// block), llama.cpp's way: the activations are quantized once per call to the same
// blocks, and each block pair is one integer dot product. Runtime dispatch: an AVX2
// kernel where the CPU has it, else a portable one (same arithmetic, same results).
//
// q8_0_linear(x [M, K] float32, qs [N, K] int8, d [N, K/32] float32) -> [M, N] float32
// y[m, n] = sum_b d[n, b] * dx[m, b] * sum_{i<32} qs[n, 32 b + i] * qx[m, 32 b + i]

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t QK = 32;

// x [M, K] -> qx [M, K] int8 and dx [M, K/32]: per block, d = max|x| / 127, q = round(x / d)
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* qx, float* dx) {
  const int64_t nb = K / QK;
  at::parallel_for(0, M * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* src = x + (i / nb) * K + (i % nb) * QK;
      int8_t* dst = qx + (i / nb) * K + (i % nb) * QK;
      float amax = 0.f;
      for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(src[j]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      for (int j = 0; j < QK; ++j) dst[j] = static_cast<int8_t>(std::nearbyint(src[j] * inv));
      dx[i] = d;
    }
  });
}

int32_t dot_block_portable(const int8_t* a, const int8_t* b) {
  int32_t s = 0;
  for (int j = 0; j < QK; ++j) s += static_cast<int32_t>(a[j]) * static_cast<int32_t>(b[j]);
  return s;
}

float row_dot_portable(const int8_t* w, const float* dw, const int8_t* q, const float* dq, int64_t nb) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) acc += dw[b] * dq[b] * static_cast<float>(dot_block_portable(w + b * QK, q + b * QK));
  return acc;
}

__attribute__((target("avx2,fma"))) float row_dot_avx2(const int8_t* w, const float* dw, const int8_t* q,
                                                        const float* dq, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i vw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * QK));
    const __m256i vq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * QK));
    // |w| * sign(q, w): an unsigned x signed byte product that maddubs can take
    const __m256i aw = _mm256_sign_epi8(vw, vw);
    const __m256i sq = _mm256_sign_epi8(vq, vw);
    const __m256i p16 = _mm256_maddubs_epi16(aw, sq);  // 16 x int16 (|w| <= 127: no saturation)
    const __m256i p32 = _mm256_madd_epi16(p16, ones);  // 8 x int32
    const __m256 scale = _mm256_set1_ps(dw[b] * dq[b]);
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p32), acc);
  }
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// One weight row against 4 activation rows: each weight block is loaded once for all 4.
__attribute__((target("avx2,fma"))) void row_dot4_avx2(const int8_t* w, const float* dw, const int8_t* q,
                                                        const float* dq, int64_t nb, int64_t K, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i vw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * QK));
    const __m256i aw = _mm256_sign_epi8(vw, vw);
    for (int r = 0; r < 4; ++r) {
      const __m256i vq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * K + b * QK));
      const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(vq, vw)), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dq[r * nb + b]), _mm256_cvtepi32_ps(p32), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    out[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}

void row_dot4_portable(const int8_t* w, const float* dw, const int8_t* q, const float* dq, int64_t nb, int64_t K,
                       float* out) {
  for (int r = 0; r < 4; ++r) out[r] = row_dot_portable(w, dw, q + r * K, dq + r * nb, nb);
}

using RowDot = float (*)(const int8_t*, const float*, const int8_t*, const float*, int64_t);
using RowDot4 = void (*)(const int8_t*, const float*, const int8_t*, const float*, int64_t, int64_t, float*);

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

const bool kAvx2 = has_avx2();
const RowDot kRowDot = kAvx2 ? row_dot_avx2 : row_dot_portable;
const RowDot4 kRowDot4 = kAvx2 ? row_dot4_avx2 : row_dot4_portable;

void check(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& d) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [M, K] float32");
  TORCH_CHECK(qs.dim() == 2 && qs.scalar_type() == torch::kInt8, "qs must be [N, K] int8");
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == torch::kFloat32, "d must be [N, K/32] float32");
  TORCH_CHECK(x.size(1) == qs.size(1) && qs.size(1) % QK == 0, "K must match and be a multiple of 32");
  TORCH_CHECK(d.size(0) == qs.size(0) && d.size(1) == qs.size(1) / QK, "d must be [N, K/32]");
  TORCH_CHECK(x.device().is_cpu() && qs.device().is_cpu() && d.device().is_cpu(), "CPU tensors only");
}

}  // namespace

torch::Tensor q8_0_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d) {
  check(x, qs, d);
  x = x.contiguous();
  qs = qs.contiguous();
  d = d.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), nb = K / QK;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * nb);
  quantize_rows(x.data_ptr<float>(), M, K, qx.data(), dx.data());
  auto y = torch::empty({M, N}, x.options());
  float* out = y.data_ptr<float>();
  const int8_t* w = qs.data_ptr<int8_t>();
  const float* dw = d.data_ptr<float>();
  // each weight row is read once for all M activation rows, 4 rows at a time
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    float four[4];
    for (int64_t n = begin; n < end; ++n) {
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        kRowDot4(w + n * K, dw + n * nb, qx.data() + m * K, dx.data() + m * nb, nb, K, four);
        for (int r = 0; r < 4; ++r) out[(m + r) * N + n] = four[r];
      }
      for (; m < M; ++m) {
        out[m * N + n] = kRowDot(w + n * K, dw + n * nb, qx.data() + m * K, dx.data() + m * nb, nb);
      }
    }
  });
  return y;
}

std::string isa() { return kAvx2 ? "avx2" : "portable"; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q8_0_linear", &q8_0_linear, "y = x @ W.T for W in Q8_0 blocks (activations quantized to Q8_0)");
  m.def("isa", &isa, "which kernel the CPU runs");
}
