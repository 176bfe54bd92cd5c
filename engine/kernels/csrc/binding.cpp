// The Python face of the block kernels (engine.kernels._blocks): checks, threads, and
// the choice of instruction set at run time (__builtin_cpu_supports).
//
// block_linear(x [M, K] float32, weights [[N_i, row_bytes_i] uint8], types [GGML type ids],
//   mode [ActMode: 0 float, 1 int8, 2 16-bit activations]) -> [M, sum N_i] float32:
//   x @ W_i.T for each weight, side by side (fused q/k/v, gate/up); the activations are
//   rounded once for all of them.
// block_dequant(w [N, row_bytes] uint8, type, K, into=None) -> [N, K] float32: the values w
// stands for (written into ``into`` when given).
// rms_norm(x [T, D] float32, w [D] float32, eps) -> [T, D]: one call for what eager torch
// runs as ~8 ops (F.rms_norm on CPU decomposes: ~70 us per decode-step norm, measured).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "blocks.h"

namespace slotserve {
namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

const bool kAvx2 = cpu_has_avx2();

void check_weight(const torch::Tensor& w, int64_t type, int64_t K) {
  const BlockInfo info = block_info(static_cast<int>(type));
  TORCH_CHECK(info.values > 0, "unknown block type ", type);
  TORCH_CHECK(K % info.values == 0, "K = ", K, " is not a whole number of blocks of ", info.values);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.device().is_cpu(), "weights: [N, bytes] uint8");
  TORCH_CHECK(w.size(1) == K / info.values * info.bytes, "a weight row of ", w.size(1), " bytes does not hold ", K,
              " values of type ", type);
  TORCH_CHECK(w.is_contiguous(), "weights must be contiguous");
}

}  // namespace

// x @ W_i.T side by side, on the AVX2 kernels when ``avx2`` (else the portable ones)
torch::Tensor linear(torch::Tensor x, const std::vector<torch::Tensor>& weights, const std::vector<int64_t>& types,
                     bool avx2, int64_t mode) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "x: [M, K] float32");
  TORCH_CHECK(weights.size() == types.size() && !weights.empty(), "one type per weight");
  TORCH_CHECK(mode == FLOAT_ACTS || mode == INT8_ACTS || mode == WIDE_ACTS, "mode: 0, 1 or 2");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), ng = (K + 255) / 256;
  TORCH_CHECK(K % 32 == 0, "K must be a multiple of 32");
  int64_t N = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    check_weight(weights[i], types[i], K);
    N += weights[i].size(0);
  }
  const float* xp = x.data_ptr<float>();
  std::vector<int8_t> qx(mode == INT8_ACTS ? M * K : 0);
  std::vector<float> dx(mode == INT8_ACTS ? M * K / 32 : 0), xs(M * K / 16);
  std::vector<int16_t> x16(mode == WIDE_ACTS ? M * K : 0);
  std::vector<float> d16(mode == WIDE_ACTS ? M * ng : 0);
  at::parallel_for(0, M, 8, [&](int64_t m0, int64_t m1) {
    if (mode == FLOAT_ACTS) {
      (avx2 ? avx2::float_sums : portable::float_sums)(xp, m0, m1, K, xs.data());
    } else if (mode == INT8_ACTS) {
      (avx2 ? avx2::quantize_acts : portable::quantize_acts)(xp, m0, m1, K, qx.data(), dx.data(), xs.data());
    } else {
      (avx2 ? avx2::quantize_wide : portable::quantize_wide)(xp, m0, m1, K, x16.data(), d16.data(), xs.data());
    }
  });
  Acts acts{xp, mode == INT8_ACTS ? qx.data() : nullptr, dx.data(), xs.data(), M, K};
  if (mode == WIDE_ACTS) {
    acts.x16 = x16.data();
    acts.d16 = d16.data();
  }
  auto y = torch::empty({M, N}, x.options());
  int64_t col = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint8_t* w = weights[i].data_ptr<uint8_t>();
    const int type = static_cast<int>(types[i]);
    float* out = y.data_ptr<float>() + col;
    at::parallel_for(0, weights[i].size(0), 16, [&](int64_t n0, int64_t n1) {
      (avx2 ? avx2::linear_rows : portable::linear_rows)(type, w, n0, n1, acts, out, N);
    });
    col += weights[i].size(0);
  }
  return y;
}

torch::Tensor block_linear(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<int64_t> types,
                           int64_t mode) {
  return linear(x, weights, types, kAvx2, mode);
}

torch::Tensor block_linear_portable(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<int64_t> types,
                                    int64_t mode) {
  return linear(x, weights, types, false, mode);
}

torch::Tensor block_dequant(torch::Tensor w, int64_t type, int64_t K, c10::optional<torch::Tensor> into) {
  check_weight(w, type, K);
  torch::Tensor out;
  if (into.has_value()) {  // a reused buffer: no fresh pages to fault in per call
    out = into.value();
    TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.dim() == 2 &&
                    out.size(0) == w.size(0) && out.size(1) == K,
                "into: a contiguous [N, K] float32 tensor");
  } else {
    out = torch::empty({w.size(0), K}, torch::kFloat32);
  }
  const uint8_t* src = w.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, w.size(0), 16, [&](int64_t n0, int64_t n1) {
    (kAvx2 ? avx2::dequant_rows : portable::dequant_rows)(static_cast<int>(type), src, n0, n1, K, dst);
  });
  return out;
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "x: [T, D] float32");
  TORCH_CHECK(w.dim() == 1 && w.scalar_type() == torch::kFloat32 && w.size(0) == x.size(1), "w: [D] float32");
  x = x.contiguous();
  w = w.contiguous();
  auto out = torch::empty_like(x);
  const int64_t D = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t m0, int64_t m1) {
    (kAvx2 ? avx2::rms_rows : portable::rms_rows)(xp, wp, m0, m1, D, static_cast<float>(eps), op);
  });
  return out;
}

std::string isa() { return kAvx2 ? "avx2" : "portable"; }

}  // namespace slotserve

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_linear", &slotserve::block_linear, "x @ W.T for weights in GGUF blocks, side by side");
  m.def("block_linear_portable", &slotserve::block_linear_portable, "block_linear on the portable kernels, any CPU");
  m.def("block_dequant", &slotserve::block_dequant, "the float32 values of weights in GGUF blocks", py::arg("w"),
        py::arg("type"), py::arg("K"), py::arg("into") = py::none());
  m.def("rms_norm", &slotserve::rms_norm, "w * x / sqrt(mean(x^2) + eps) per row, float32");
  m.def("isa", &slotserve::isa, "the instruction set the kernels run on this CPU");
}
