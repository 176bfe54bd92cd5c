// The Python face of the block kernels (engine.kernels._blocks): checks, threads, and
// the choice of instruction set at run time (__builtin_cpu_supports; SLOTSERVE_ISA caps it).
//
// block_linear(x [M, K] float32, weights [[N_i, row_bytes_i] uint8], types [GGML type ids],
//   mode [ActMode: 0 float, 1 int8, 2 16-bit activations]) -> [M, sum N_i] float32:
//   x @ W_i.T for each weight, side by side (fused q/k/v, gate/up); the activations are
//   rounded once for all of them.
// block_linear_on(..., isa): the same on a named kernel unit ("portable", "avx2", "avx512";
//   isas() lists those this CPU runs): tests and benchmarks compare them in one process.
// block_dequant(w [N, row_bytes] uint8, type, K, into=None) -> [N, K] float32: the values w
// stands for (written into ``into`` when given).
// rms_norm(x [T, D] float32, w [D] float32, eps) -> [T, D]: one call for what eager torch
// runs as ~8 ops (F.rms_norm on CPU decomposes: ~70 us per decode-step norm, measured).
// decode_attention(q [B, H, D], k, v [B, KVH, L, stored row], kv_pos [B, L] int64, q_pos [B]
//   int64, window, scale, softcap, portable=False) -> [B, H, D] float32: one query row per
//   sequence (see attention_impl.inc; window and softcap <= 0: none; portable: the any-CPU
//   kernel). k and v are read as stored: float32/float16/bfloat16 rows of D, or uint8 rows
//   of D + D/16 bytes holding q8_0 (memory/kv_codec.py's layout). q_seq [R] int64: the key
//   set each row reads (default: its own); sinks [H] float32: a logit per query head in the
//   softmax without a value (gpt-oss's attention sinks).
// rope(x [T, N, D], cos [T, 1, D], sin [T, 1, D], portable=False) -> [T, N, D]: rotate-half rotary embedding
//   (rope_impl.inc); x's rows may be strided (a view of a fused q/k/v output).
// silu_mul(gu [T, 2F], portable=False) -> [T, F]: silu(gu[:, :F]) * gu[:, F:] (mlp_impl.inc).
// delta_step(q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H], state [B, H, Dk, Dv], portable=False)
//   -> y [B, H, Dv]: the gated delta rule's decode step, state updated in place (delta_impl.inc).
// conv_step(x [B, C], window [B, C, K - 1], weight [C, K], bias [C] or None, portable=False) -> [B, C]:
//   the short causal convolution's decode step, the window shifted in place (conv_impl.inc).
// float_linear(x [T, K], w [N, K], bias [N] or None, portable=False) -> [T, N]: x @ w.T, each output
//   one dot product in a fixed order whatever T (float_impl.inc).
// moe_route, moe_experts: a mixture-of-experts layer's router and routed packed experts
//   (moe_op.inc).
// finite_argmax(logits [S, V] float32, bound) -> [S] int64: each row made finite in place
//   (NaN -> -bound, clamped to +-bound), then its first maximum's index.

// ATen and torch's pybind11 casters only, not <torch/extension.h> (all of libtorch's C++
// API): the unit parses in about half the time, the largest part of the install's build.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "blocks.h"

namespace slotserve {
namespace {

// The kernel units, least to most demanding; the best one this CPU runs is used, unless
// SLOTSERVE_ISA names a lesser one (to compare them in one machine, or to step around one).
enum class Isa : int { portable = 0, avx2 = 1, avx512 = 2 };
constexpr const char* kIsaNames[] = {"portable", "avx2", "avx512"};

bool cpu_runs(Isa isa) {
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  switch (isa) {
    case Isa::portable: return true;
    case Isa::avx2: return avx2;
    case Isa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Isa isa_named(const std::string& name) {
  for (int i = 0; i < 3; ++i)
    if (name == kIsaNames[i]) return static_cast<Isa>(i);
  TORCH_CHECK(false, "unknown instruction set '", name, "' (portable, avx2, avx512)");
}

Isa best_isa() {
  Isa best = Isa::portable;
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (cpu_runs(isa)) best = isa;
  const char* cap = std::getenv("SLOTSERVE_ISA");
  if (cap != nullptr && *cap != '\0') {
    for (int i = 0; i < 3; ++i)
      if (std::string(cap) == kIsaNames[i] && i < static_cast<int>(best)) best = static_cast<Isa>(i);
  }
  return best;
}

const Isa kIsa = best_isa();

// Whether 512-bit integer dot products issue whole (Intel) rather than as two 256-bit
// halves (AMD's Zen 4): the packed kernels then take two 8-row groups a vector.
// SLOTSERVE_WIDE=0/1 overrides (A/B runs).
bool wide_vectors() {
  const char* set = std::getenv("SLOTSERVE_WIDE");
  if (set != nullptr && *set != '\0') return std::string(set) == "1";
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}

const bool kWideVectors = wide_vectors();

// fn of the unit ``isa`` (a function pointer: the three have one signature)
#define ON(isa, fn) ((isa) == Isa::avx512 ? avx512::fn : (isa) == Isa::avx2 ? avx2::fn : portable::fn)

void check_weight(const at::Tensor& w, int64_t type, int64_t K) {
  const BlockInfo info = block_info(static_cast<int>(type));
  TORCH_CHECK(info.values > 0, "unknown block type ", type);
  TORCH_CHECK(K % info.values == 0, "K = ", K, " is not a whole number of blocks of ", info.values);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.device().is_cpu(), "weights: [N, bytes] uint8");
  TORCH_CHECK(w.size(1) == K / info.values * info.bytes, "a weight row of ", w.size(1), " bytes does not hold ", K,
              " values of type ", type);
  TORCH_CHECK(w.is_contiguous(), "weights must be contiguous");
}

}  // namespace

// x @ W_i.T side by side, on the kernels of ``isa``
at::Tensor linear(at::Tensor x, const std::vector<at::Tensor>& weights, const std::vector<int64_t>& types,
                     Isa isa, int64_t mode) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: [M, K] float32");
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
      ON(isa, float_sums)(xp, m0, m1, K, xs.data());
    } else if (mode == INT8_ACTS) {
      ON(isa, quantize_acts)(xp, m0, m1, K, qx.data(), dx.data(), xs.data());
    } else {
      ON(isa, quantize_wide)(xp, m0, m1, K, x16.data(), d16.data(), xs.data());
    }
  });
  Acts acts{xp, mode == INT8_ACTS ? qx.data() : nullptr, dx.data(), xs.data(), M, K};
  if (mode == WIDE_ACTS) {
    acts.x16 = x16.data();
    acts.d16 = d16.data();
  }
  auto y = at::empty({M, N}, x.options());
  int64_t col = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint8_t* w = weights[i].data_ptr<uint8_t>();
    const int type = static_cast<int>(types[i]);
    float* out = y.data_ptr<float>() + col;
    at::parallel_for(0, weights[i].size(0), 16, [&](int64_t n0, int64_t n1) {
      ON(isa, linear_rows)(type, w, n0, n1, acts, out, N);
    });
    col += weights[i].size(0);
  }
  return y;
}

at::Tensor block_linear(at::Tensor x, std::vector<at::Tensor> weights, std::vector<int64_t> types,
                           int64_t mode) {
  return linear(x, weights, types, kIsa, mode);
}

at::Tensor block_linear_on(at::Tensor x, std::vector<at::Tensor> weights, std::vector<int64_t> types,
                              int64_t mode, const std::string& name) {
  const Isa isa = isa_named(name);
  TORCH_CHECK(cpu_runs(isa), "this CPU does not run the ", name, " kernels");
  return linear(x, weights, types, isa, mode);
}

at::Tensor block_dequant(at::Tensor w, int64_t type, int64_t K, c10::optional<at::Tensor> into) {
  check_weight(w, type, K);
  at::Tensor out;
  if (into.has_value()) {  // a reused buffer: no fresh pages to fault in per call
    out = into.value();
    TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                    out.size(0) == w.size(0) && out.size(1) == K,
                "into: a contiguous [N, K] float32 tensor");
  } else {
    out = at::empty({w.size(0), K}, at::kFloat);
  }
  const uint8_t* src = w.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, w.size(0), 16, [&](int64_t n0, int64_t n1) {
    ON(kIsa, dequant_rows)(static_cast<int>(type), src, n0, n1, K, dst);
  });
  return out;
}

at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: [T, D] float32");
  TORCH_CHECK(w.dim() == 1 && w.scalar_type() == at::kFloat && w.size(0) == x.size(1), "w: [D] float32");
  x = x.contiguous();
  w = w.contiguous();
  auto out = at::empty_like(x);
  const int64_t D = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t m0, int64_t m1) {
    ON(kIsa, rms_rows)(xp, wp, m0, m1, D, static_cast<float>(eps), op);
  });
  return out;
}

// The KvRow of a cache tensor whose last dimension is ``width`` for head dim D.
int kv_row(const at::Tensor& t, int64_t D) {
  switch (t.scalar_type()) {
    case at::kFloat: TORCH_CHECK(t.size(-1) == D, "k, v: float32 rows of D"); return KV_F32;
    case at::kHalf: TORCH_CHECK(t.size(-1) == D, "k, v: float16 rows of D"); return KV_F16;
    case at::kBFloat16: TORCH_CHECK(t.size(-1) == D, "k, v: bfloat16 rows of D"); return KV_BF16;
    case at::kByte:
      TORCH_CHECK(D % 32 == 0 && t.size(-1) == D + D / 16, "k, v: q8_0 rows of D + D / 16 bytes (D % 32 == 0)");
      return KV_Q8_0;
    default: TORCH_CHECK(false, "k, v: float32, float16, bfloat16 or q8_0 (uint8) rows");
  }
  return KV_F32;
}

at::Tensor decode_attention(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor kv_pos,
                               at::Tensor q_pos, int64_t window, double scale, double softcap, bool any_cpu,
                               c10::optional<at::Tensor> q_seq, c10::optional<at::Tensor> sinks) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.dim() == 4, "q: [R, H, D]; k, v: [B, KVH, L, stored row]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.device().is_cpu(), "q: float32 on the CPU");
  for (const auto* t : {&k, &v})
    TORCH_CHECK(t->device().is_cpu() && t->stride(-1) == 1, "k, v: on the CPU, stored rows contiguous");
  q = q.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = k.size(1), L = k.size(2);
  const int64_t S = k.size(0);  // key sets: one per row, or (with q_seq) fewer
  const int k_type = kv_row(k, D), v_type = kv_row(v, D);
  TORCH_CHECK(v.size(0) == S && v.size(1) == KVH && v.size(2) == L && KVH > 0 && H % KVH == 0,
              "k, v: [S, KVH, L, stored row] with KVH dividing H");
  TORCH_CHECK(kv_pos.scalar_type() == at::kLong && kv_pos.dim() == 2 && kv_pos.size(0) == S &&
                  kv_pos.size(1) == L,
              "kv_pos: [S, L] int64");
  q_pos = q_pos.contiguous();
  TORCH_CHECK(q_pos.scalar_type() == at::kLong && q_pos.numel() == B, "q_pos: [R] int64");
  const int64_t* seq = nullptr;
  at::Tensor seq_t;
  if (q_seq.has_value()) {
    seq_t = q_seq->contiguous();
    TORCH_CHECK(seq_t.scalar_type() == at::kLong && seq_t.numel() == B, "q_seq: [R] int64");
    TORCH_CHECK(B == 0 || (seq_t.min().item<int64_t>() >= 0 && seq_t.max().item<int64_t>() < S),
                "q_seq: key sets outside k");
    seq = seq_t.data_ptr<int64_t>();
  } else {
    TORCH_CHECK(S == B, "k, v: one key set per query row (or q_seq)");
  }
  const float* sink = nullptr;
  at::Tensor sinks_t;
  if (sinks.has_value()) {
    sinks_t = sinks->contiguous();
    TORCH_CHECK(sinks_t.scalar_type() == at::kFloat && sinks_t.numel() == H, "sinks: [H] float32");
    sink = sinks_t.data_ptr<float>();
  }
  auto out = at::empty({B, H, D}, q.options());
  const int64_t ke = k.element_size(), ve = v.element_size();
  DecodeAttention a{q.data_ptr<float>(),
                    static_cast<const uint8_t*>(k.data_ptr()),
                    static_cast<const uint8_t*>(v.data_ptr()),
                    k_type,
                    v_type,
                    k.stride(0) * ke, k.stride(1) * ke, k.stride(2) * ke,
                    v.stride(0) * ve, v.stride(1) * ve, v.stride(2) * ve,
                    kv_pos.data_ptr<int64_t>(), kv_pos.stride(0), kv_pos.stride(1), q_pos.data_ptr<int64_t>(),
                    seq, B, H, KVH, L, D, window, static_cast<float>(scale), static_cast<float>(softcap),
                    sink, out.data_ptr<float>()};
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, (H / KVH) * L * D));
  at::parallel_for(0, B * KVH, grain, [&](int64_t t0, int64_t t1) {
    ON(any_cpu ? Isa::portable : kIsa, decode_attention)(a, t0, t1);
  });
  return out;
}

at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin, bool any_cpu) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: [T, N, D] float32");
  const int64_t T = x.size(0), N = x.size(1), D = x.size(2);
  if (x.stride(2) != 1 || x.stride(1) != D) x = x.contiguous();
  TORCH_CHECK(D % 2 == 0, "D must be even");
  cos = cos.reshape({T, D}).contiguous();
  sin = sin.reshape({T, D}).contiguous();
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos, sin: float32");
  auto out = at::empty({T, N, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const int64_t st = x.stride(0);
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / (N * D)), [&](int64_t t0, int64_t t1) {
    ON(any_cpu ? Isa::portable : kIsa, rope_rows)(xp, st, N, D, cos.data_ptr<float>(), sin.data_ptr<float>(), t0,
                                                    t1, out.data_ptr<float>());
  });
  return out;
}

at::Tensor delta_step(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta, at::Tensor state,
                      bool any_cpu) {
  TORCH_CHECK(state.dim() == 4 && state.scalar_type() == at::kFloat && state.device().is_cpu() &&
                  state.is_contiguous(),
              "state: contiguous [B, H, Dk, Dv] float32 on the CPU");
  const int64_t B = state.size(0), H = state.size(1), Dk = state.size(2), Dv = state.size(3);
  auto rows = [&](at::Tensor t, int64_t n, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu() && t.numel() == B * H * n, what);
    return t.contiguous();
  };
  q = rows(q, Dk, "q: [B, H, Dk] float32");
  k = rows(k, Dk, "k: [B, H, Dk] float32");
  v = rows(v, Dv, "v: [B, H, Dv] float32");
  g = rows(g, 1, "g: [B, H] float32");
  beta = rows(beta, 1, "beta: [B, H] float32");
  auto y = at::empty({B, H, Dv}, q.options());
  at::parallel_for(0, B * H, 1, [&](int64_t t0, int64_t t1) {
    ON(any_cpu ? Isa::portable : kIsa, delta_step_rows)(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                                        g.data_ptr<float>(), beta.data_ptr<float>(),
                                                        state.data_ptr<float>(), Dk, Dv, t0, t1, y.data_ptr<float>());
  });
  return y;
}

// An optional float32 vector of n values, contiguous (undefined when not given).
at::Tensor float_vector(const c10::optional<at::Tensor>& t, int64_t n, const char* what) {
  if (!t.has_value()) return at::Tensor();
  at::Tensor v = t->contiguous();
  TORCH_CHECK(v.numel() == n && v.scalar_type() == at::kFloat, what);
  return v;
}

at::Tensor conv_step(at::Tensor x, at::Tensor window, at::Tensor weight, c10::optional<at::Tensor> bias,
                     bool any_cpu) {
  TORCH_CHECK(window.dim() == 3 && window.scalar_type() == at::kFloat && window.device().is_cpu() &&
                  window.is_contiguous(),
              "window: contiguous [B, C, K - 1] float32 on the CPU");
  const int64_t B = window.size(0), C = window.size(1), K = window.size(2) + 1;
  TORCH_CHECK(x.dim() == 2 && x.size(0) == B && x.size(1) == C && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "x: [B, C] float32, rows contiguous");
  weight = weight.contiguous();
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == C && weight.size(1) == K && weight.scalar_type() == at::kFloat,
              "weight: [C, K] float32");
  const at::Tensor b = float_vector(bias, C, "bias: [C] float32");
  auto out = at::empty({B, C}, x.options());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  at::parallel_for(0, B * C, 4096, [&](int64_t r0, int64_t r1) {
    ON(any_cpu ? Isa::portable : kIsa, conv_step_rows)(x.data_ptr<float>(), x.stride(0), window.data_ptr<float>(),
                                                       weight.data_ptr<float>(), bp, C, K, r0, r1,
                                                       out.data_ptr<float>());
  });
  return out;
}

at::Tensor float_linear(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias, bool any_cpu) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: [T, K] float32 on the CPU");
  if (x.stride(1) != 1) x = x.contiguous();
  w = w.contiguous();
  const int64_t T = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.dim() == 2 && w.size(1) == K && w.scalar_type() == at::kFloat, "w: [N, K] float32");
  const at::Tensor b = float_vector(bias, N, "bias: [N] float32");
  auto y = at::empty({T, N}, x.options());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  at::parallel_for(0, T * N, std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1)), [&](int64_t i0, int64_t i1) {
    ON(any_cpu ? Isa::portable : kIsa, float_rows)(x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), bp, N, K,
                                                   i0, i1, y.data_ptr<float>());
  });
  return y;
}

at::Tensor silu_mul(at::Tensor gu, bool any_cpu) {
  TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == at::kFloat && gu.device().is_cpu() && gu.size(1) % 2 == 0,
              "gu: [T, 2F] float32");
  if (gu.stride(1) != 1) gu = gu.contiguous();
  const int64_t T = gu.size(0), F = gu.size(1) / 2;
  auto out = at::empty({T, F}, gu.options());
  const float* gp = gu.data_ptr<float>();
  const int64_t ld = gu.stride(0);
  at::parallel_for(0, T, std::max<int64_t>(1, 32768 / F), [&](int64_t t0, int64_t t1) {
    ON(any_cpu ? Isa::portable : kIsa, silu_mul_rows)(gp, ld, F, t0, t1, out.data_ptr<float>());
  });
  return out;
}

// ---- rows repacked eight at a time (packed_impl.inc) -----------------------------------

int64_t packed_bytes(int64_t type, int64_t K) { return portable::packed_group_bytes(static_cast<int>(type), K); }

at::Tensor block_pack(at::Tensor w, int64_t type, int64_t K) {
  check_weight(w, type, K);
  const int64_t group_bytes = packed_bytes(type, K);
  TORCH_CHECK(group_bytes > 0, "type ", type, " with K = ", K, " has no packed layout");
  TORCH_CHECK(w.size(0) % 8 == 0, "packed weights have a multiple of 8 rows, not ", w.size(0));
  auto out = at::empty({w.size(0) / 8, group_bytes}, at::kByte);
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, w.size(0) / 8, 8, [&](int64_t g0, int64_t g1) {
    portable::pack_groups(static_cast<int>(type), src, g0, g1, K, dst);
  });
  return out;
}

void check_packed(const at::Tensor& p, int64_t type, int64_t K) {
  const int64_t group_bytes = packed_bytes(type, K);
  TORCH_CHECK(group_bytes > 0, "type ", type, " with K = ", K, " has no packed layout");
  TORCH_CHECK(p.dim() == 2 && p.scalar_type() == at::kByte && p.device().is_cpu() && p.is_contiguous() &&
                  p.size(1) == group_bytes,
              "packed weights: contiguous [N / 8, ", group_bytes, "] uint8");
}

at::Tensor packed_dequant(at::Tensor p, int64_t type, int64_t K) {
  check_packed(p, type, K);
  auto out = at::empty({p.size(0) * 8, K}, at::kFloat);
  const uint8_t* src = p.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, p.size(0), 8, [&](int64_t g0, int64_t g1) {
    portable::packed_dequant_groups(static_cast<int>(type), src, g0, g1, K, dst);
  });
  return out;
}

bool k_quant(int64_t type) { return type == Q4_K || type == Q5_K || type == Q6_K || type == IQ4_XS; }  // llama.cpp's Q8_K

// x @ W_i.T side by side for packed weights, on the kernels of ``isa``
at::Tensor packed_linear_isa(at::Tensor x, const std::vector<at::Tensor>& packs,
                                const std::vector<int64_t>& types, Isa isa) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: [M, K] float32");
  TORCH_CHECK(packs.size() == types.size() && !packs.empty(), "one type per weight");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "K must be a multiple of 32");
  std::vector<int64_t> first{0};  // each part's first group
  bool want32 = false, want256 = false;
  for (size_t i = 0; i < packs.size(); ++i) {
    check_packed(packs[i], types[i], K);
    first.push_back(first.back() + packs[i].size(0));
    (k_quant(types[i]) ? want256 : want32) = true;
  }
  const int64_t N = first.back() * 8;
  const float* xp = x.data_ptr<float>();
  // the activations rounded once per block size the parts ask for (256: K-quants, 32: the others)
  struct Rounded {
    std::vector<int8_t> qx;
    std::vector<float> dx32, isum16, isum32;
  } r32, r256;
  for (auto [want, group, r] : {std::tuple{want32, 32, &r32}, std::tuple{want256, 256, &r256}}) {
    if (!want) continue;
    r->qx.resize(M * K);
    r->dx32.resize(M * K / 32);
    r->isum16.resize(M * K / 16);
    r->isum32.resize(M * K / 32);
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
      ON(isa, quantize_q8)(xp, m0, m1, K, group, r->qx.data(), r->dx32.data(), r->isum16.data(), r->isum32.data());
    });
  }
  const bool wide = isa == Isa::avx512 && kWideVectors;
  const PackedActs a32{r32.qx.data(), r32.dx32.data(), r32.isum16.data(), r32.isum32.data(), M, K, wide};
  const PackedActs a256{r256.qx.data(), r256.dx32.data(), r256.isum16.data(), r256.isum32.data(), M, K, wide};
  auto y = at::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, first.back(), 1, [&](int64_t g0, int64_t g1) {
    for (size_t i = 0; i < packs.size(); ++i) {  // the parts this range of groups crosses
      const int64_t lo = std::max(g0, first[i]), hi = std::min(g1, first[i + 1]);
      if (lo >= hi) continue;
      ON(isa, packed_rows)(static_cast<int>(types[i]), packs[i].data_ptr<uint8_t>(), lo - first[i], hi - first[i],
                           k_quant(types[i]) ? a256 : a32, yp + 8 * first[i], N);
    }
  });
  return y;
}

at::Tensor packed_linear(at::Tensor x, std::vector<at::Tensor> packs, std::vector<int64_t> types) {
  return packed_linear_isa(x, packs, types, kIsa);
}

at::Tensor packed_linear_on(at::Tensor x, std::vector<at::Tensor> packs, std::vector<int64_t> types,
                               const std::string& name) {
  const Isa isa = isa_named(name);
  TORCH_CHECK(cpu_runs(isa), "this CPU does not run the ", name, " kernels");
  return packed_linear_isa(x, packs, types, isa);
}

#include "moe_op.inc"

// ---- the decode step's pieces, stored and chained in C++ -------------------------------

// x [n, D] (or [..., D]) float32 encoded as ``cache`` stores rows (kv_row) into rows
// ``rows`` [n] of cache [R, stored row]: memory/kv_codec.py's encode and one index_copy_.
void kv_store(at::Tensor cache, at::Tensor rows, at::Tensor x, bool any_cpu) {
  TORCH_CHECK(cache.dim() == 2 && cache.device().is_cpu() && cache.stride(1) == 1, "cache: [R, stored row], rows contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: float32 on the CPU");
  const int64_t D = x.size(-1);
  x = x.reshape({-1, D});
  if (x.stride(1) != 1) x = x.contiguous();
  rows = rows.contiguous();
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.numel() == x.size(0), "rows: [n] int64, one per row of x");
  const int type = kv_row(cache, D);
  const int64_t* rp = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < cache.size(0), "row ", rp[i], " is outside the cache's ", cache.size(0));
  uint8_t* cp = static_cast<uint8_t*>(cache.data_ptr());
  const int64_t ldc = cache.stride(0) * cache.element_size();
  ON(any_cpu ? Isa::portable : kIsa, store_rows)(type, x.data_ptr<float>(), x.stride(0), D, rp, 0, x.size(0), cp, ldc);
}

// Decode rows of per-stream caches k_cache, v_cache [S, KVH, C, stored row] in one call:
// k, v [B, KVH, D] stored at ``rows`` of the caches seen flat (kv_store), then q [B, H, D]
// attends over streams first .. first + B - 1, their first n_kv cells (decode_attention).
at::Tensor stream_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor k_cache,
                            at::Tensor v_cache, at::Tensor rows, int64_t first, int64_t n_kv,
                            at::Tensor kv_pos, at::Tensor q_pos, int64_t window, double scale, double softcap,
                            c10::optional<at::Tensor> sinks) {
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches: contiguous [S, KVH, C, stored row]");
  const int64_t B = q.size(0);
  TORCH_CHECK(first >= 0 && first + B <= k_cache.size(0) && n_kv >= 0 && n_kv <= k_cache.size(2),
              "streams ", first, "..", first + B, " and ", n_kv, " cells are outside the cache");
  kv_store(k_cache.view({-1, k_cache.size(3)}), rows, k, false);
  kv_store(v_cache.view({-1, v_cache.size(3)}), rows, v, false);
  return decode_attention(q, k_cache.narrow(0, first, B).narrow(2, 0, n_kv), v_cache.narrow(0, first, B).narrow(2, 0, n_kv),
                          kv_pos, q_pos, window, scale, softcap, false, c10::nullopt, sinks);
}

// The attention half's way in, for rows x [T, hidden] of a Llama-family layer whose
// projections are packed: RMSNorm, the fused q/k/v projection (+ its bias [(H + 2 KVH) D]
// where given), rotary on q and k. -> q [T, H, D], k [T, KVH, D] (rotated), v [T, KVH, D].
std::vector<at::Tensor> layer_qkv(at::Tensor x, at::Tensor norm, double eps, std::vector<at::Tensor> packs,
                                     std::vector<int64_t> types, int64_t H, int64_t KVH, at::Tensor cos,
                                     at::Tensor sin, c10::optional<at::Tensor> bias) {
  auto qkv = packed_linear(rms_norm(x, norm, eps), std::move(packs), std::move(types));  // [T, (H + 2 KVH) D]
  if (bias.has_value()) qkv.add_(*bias);
  const int64_t T = x.size(0), D = qkv.size(1) / (H + 2 * KVH);
  TORCH_CHECK(D * (H + 2 * KVH) == qkv.size(1), "the q/k/v projection's rows are not (H + 2 KVH) heads");
  auto qk = rope(qkv.narrow(1, 0, (H + KVH) * D).view({T, H + KVH, D}), cos, sin, false);  // [T, H + KVH, D]
  return {qk.narrow(1, 0, H), qk.narrow(1, H, KVH), qkv.narrow(1, (H + KVH) * D, KVH * D).view({T, KVH, D})};
}

// The attention's output projection and the residual: h = x + (o(att) + o_bias); then
// h's RMSNorm for whatever MLP follows. x [T, hidden], att [T, H * D] -> h, norm(h) [T, hidden].
std::vector<at::Tensor> layer_attn_out(at::Tensor x, at::Tensor att, std::vector<at::Tensor> o,
                                          std::vector<int64_t> o_types, c10::optional<at::Tensor> o_bias,
                                          at::Tensor norm, double eps) {
  auto h = packed_linear(att.reshape({att.size(0), -1}), std::move(o), std::move(o_types));  // [T, hidden]
  if (o_bias.has_value()) h.add_(*o_bias);
  h.add_(x);
  return {h, rms_norm(h, norm, eps)};
}

// The rest of the layer after attention: h = x + o(att), then h + down(silu(gate) * up) of
// h's RMSNorm, each projection's bias added where given (the eager layer's order: a
// projection's bias, then the residual). x [T, hidden], att [T, H * D] -> [T, hidden].
at::Tensor layer_out(at::Tensor x, at::Tensor att, std::vector<at::Tensor> o, std::vector<int64_t> o_types,
                        c10::optional<at::Tensor> o_bias, at::Tensor norm, double eps,
                        std::vector<at::Tensor> gate_up, std::vector<int64_t> gate_up_types,
                        c10::optional<at::Tensor> gate_up_bias, std::vector<at::Tensor> down,
                        std::vector<int64_t> down_types, c10::optional<at::Tensor> down_bias) {
  auto hn = layer_attn_out(x, att, std::move(o), std::move(o_types), o_bias, norm, eps);
  auto gu = packed_linear(hn[1], std::move(gate_up), std::move(gate_up_types));  // [T, 2F]
  if (gate_up_bias.has_value()) gu.add_(*gate_up_bias);
  auto y = packed_linear(silu_mul(gu, false), std::move(down), std::move(down_types));  // [T, hidden]
  if (down_bias.has_value()) y.add_(*down_bias);
  return y.add_(hn[0]);
}

// Each row of logits [S, V] float32 kept finite in place (NaN -> -bound, then clamped to
// +-bound), and its argmax (the first of equal maxima, as torch.argmax) -> [S] int64: what
// sampling does to every row before the greedy pick, one pass instead of three ops.
at::Tensor finite_argmax(at::Tensor logits, double bound) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() &&
                  logits.is_contiguous() && logits.size(1) > 0,
              "logits: contiguous [S, V > 0] float32 on the CPU");
  const int64_t S = logits.size(0), V = logits.size(1);
  auto out = at::empty({S}, logits.options().dtype(at::kLong));
  float* lp = logits.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, S, 1, [&](int64_t s0, int64_t s1) {
    ON(kIsa, finite_argmax_rows)(lp, V, s0, s1, static_cast<float>(bound), op);
  });
  return out;
}

std::string isa() { return kIsaNames[static_cast<int>(kIsa)]; }

bool wide() { return kIsa == Isa::avx512 && kWideVectors; }

std::vector<std::string> isas() {
  std::vector<std::string> out;
  for (int i = 0; i < 3; ++i)
    if (cpu_runs(static_cast<Isa>(i))) out.emplace_back(kIsaNames[i]);
  return out;
}

}  // namespace slotserve

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The long calls let go of the GIL (as torch's own ops do), so the server's event loop
  // runs while a matmul does; the short ones keep it (no hand-over per few microseconds).
  const auto free_gil = py::call_guard<py::gil_scoped_release>();
  m.def("block_linear", &slotserve::block_linear, "x @ W.T for weights in GGUF blocks, side by side", free_gil);
  m.def("block_linear_on", &slotserve::block_linear_on, "block_linear on the named kernel unit (one of isas())",
        free_gil);
  m.def("block_dequant", &slotserve::block_dequant, "the float32 values of weights in GGUF blocks", py::arg("w"),
        py::arg("type"), py::arg("K"), py::arg("into") = py::none(), free_gil);
  m.def("rms_norm", &slotserve::rms_norm, "w * x / sqrt(mean(x^2) + eps) per row, float32");
  m.def("decode_attention", &slotserve::decode_attention,
        "query rows, each against its sequence's stored keys up to its own position",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kv_pos"), py::arg("q_pos"), py::arg("window"),
        py::arg("scale"), py::arg("softcap"), py::arg("portable") = false, py::arg("q_seq") = py::none(),
        py::arg("sinks") = py::none(), free_gil);
  m.def("rope", &slotserve::rope, "rotate-half rotary embedding in one pass, float32", py::arg("x"), py::arg("cos"),
        py::arg("sin"), py::arg("portable") = false);
  m.def("delta_step", &slotserve::delta_step, "the gated delta rule's decode step, the state in place",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"),
        py::arg("portable") = false, free_gil);
  m.def("conv_step", &slotserve::conv_step, "the short causal convolution's decode step, the window in place",
        py::arg("x"), py::arg("window"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("portable") = false,
        free_gil);
  m.def("float_linear", &slotserve::float_linear, "x @ w.T, each output one dot product in a fixed order",
        py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("portable") = false, free_gil);
  m.def("silu_mul", &slotserve::silu_mul, "silu(first half) * second half of each row, float32", py::arg("gu"),
        py::arg("portable") = false);
  m.def("kv_store", &slotserve::kv_store, "rows of x encoded as the cache stores them, written at rows",
        py::arg("cache"), py::arg("rows"), py::arg("x"), py::arg("portable") = false);
  m.def("stream_decode", &slotserve::stream_decode, "store decode rows' keys and values, then attend, per stream",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("rows"),
        py::arg("first"), py::arg("n_kv"), py::arg("kv_pos"), py::arg("q_pos"), py::arg("window"), py::arg("scale"),
        py::arg("softcap"), py::arg("sinks") = py::none(), free_gil);
  m.def("layer_qkv", &slotserve::layer_qkv, "RMSNorm, packed q/k/v projection (+ bias), rotary: q, k, v",
        py::arg("x"), py::arg("norm"), py::arg("eps"), py::arg("packs"), py::arg("types"), py::arg("H"),
        py::arg("KVH"), py::arg("cos"), py::arg("sin"), py::arg("bias") = py::none(), free_gil);
  m.def("layer_attn_out", &slotserve::layer_attn_out, "o projection (+ bias) + residual, and its RMSNorm",
        free_gil);
  m.def("layer_out", &slotserve::layer_out, "o projection + residual, RMSNorm, packed gated MLP + residual",
        free_gil);
  m.def("packed_bytes", &slotserve::packed_bytes, "bytes of 8 packed rows of K values (0: no packed layout)");
  m.def("block_pack", &slotserve::block_pack, "weights in GGUF blocks [N, row_bytes] -> 8-row groups", free_gil);
  m.def("packed_dequant", &slotserve::packed_dequant, "the float32 values [N, K] of packed weights", free_gil);
  m.def("packed_linear", &slotserve::packed_linear, "x @ W.T for packed weights, side by side (int8 activations)",
        free_gil);
  m.def("packed_linear_on", &slotserve::packed_linear_on, "packed_linear on the named kernel unit", free_gil);
  m.def("moe_route", &slotserve::moe_route, "a router's top-k experts and their weights", py::arg("x"),
        py::arg("w"), py::arg("bias"), py::arg("k"), py::arg("mode"), free_gil);
  py::class_<slotserve::ExpertSet, std::shared_ptr<slotserve::ExpertSet>>(m, "ExpertSet")
      .def(py::init(&slotserve::expert_set), py::arg("gate_up"), py::arg("gate_up_types"), py::arg("down"),
           py::arg("down_types"), py::arg("gate_up_bias"), py::arg("down_bias"), py::arg("act"), py::arg("alpha"),
           py::arg("limit"));
  m.def("moe_experts", &slotserve::moe_experts, "each token's packed experts, weighted and summed", free_gil);
  m.def("finite_argmax", &slotserve::finite_argmax, "rows kept finite in place (NaN -> -bound, clamped), argmax",
        py::arg("logits"), py::arg("bound"));
  m.def("wide", &slotserve::wide, "whether the packed kernels take 16 rows in 512-bit vectors here");
  m.def("isa", &slotserve::isa, "the instruction set the kernels run on this CPU");
  m.def("isas", &slotserve::isas, "every kernel unit this CPU runs, least demanding first");
}
