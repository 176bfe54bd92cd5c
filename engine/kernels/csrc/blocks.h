// GGUF's block types as the kernels see them: the GGML type number, how many values a
// block holds and how many bytes it takes. The layouts themselves are decoded in
// blocks_impl.inc, compiled once per instruction set (blocks_avx512.cpp, blocks_avx2.cpp,
// blocks_portable.cpp).
#pragma once

#include <cstdint>

namespace slotserve {

enum BlockType : int {
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  MXFP4 = 39,  // OCP microscaling FP4 (gpt-oss's experts): an e8m0 scale, 32 e2m1 values
};

struct BlockInfo {
  int values;  // per block (0: not a type the kernels know)
  int bytes;   // per block
};

inline BlockInfo block_info(int type) {
  switch (type) {
    case F16: return {1, 2};
    case BF16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case IQ4_NL: return {32, 18};
    case Q2_K: return {256, 84};
    case Q3_K: return {256, 110};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    case IQ4_XS: return {256, 136};
    case MXFP4: return {32, 17};
    default: return {0, 0};
  }
}

inline bool is_float_type(int type) { return type == F16 || type == BF16; }

// How a call rounds its activations (block_linear's ``mode``).
enum ActMode : int {
  FLOAT_ACTS = 0,  // none: float32 products
  INT8_ACTS = 1,   // llama.cpp's: int8 blocks of 32 values
  WIDE_ACTS = 2,   // 16-bit: integers within +-16383 per 256 values (wide_impl.inc)
};

// Activations of one call, prepared once and shared by every weight they meet. With
// int8 rounding: per 32 values an int8 block qx and its scale dx (d = max|x| / 127). With
// 16-bit rounding: x16 and one scale d16 per 256 values. xs: the sums per 16 of the
// values as rounded (float sums when not rounded); they serve the types whose values
// carry an offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K).
struct Acts {
  const float* x;     // [M, K]
  const int8_t* qx;   // [M, K], or null
  const float* dx;    // [M, K/32]
  const float* xs;    // [M, K/16]
  int64_t M, K;
  const int16_t* x16 = nullptr;  // [M, K], or null
  const float* d16 = nullptr;    // [M, ceil(K/256)]
};

// Activations of a packed matmul (packed_impl.inc): int8 values qx [M, K] in blocks of 32
// or 256 values, the block's scale written per 32 values (dx32 [M, K/32]), and the integer
// sums of qx per 16 and per 32 values, as floats (isum16 [M, K/16], isum32 [M, K/32]).
struct PackedActs {
  const int8_t* qx;
  const float* dx32;
  const float* isum16;
  const float* isum32;
  int64_t M, K;
  bool wide = false;  // 512-bit tiles of two groups (the AVX-512 unit, on CPUs that issue them whole)
};

// How an attention cache stores a row of D values (memory/kv_codec.py, llama-server's
// -ctk/-ctv): float32, float16, bfloat16, or q8_0 (D int8 values, then D/32 float16 scales).
enum KvRow : int { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_Q8_0 = 3 };

// One decode attention call (attention_impl.inc): q [B, H, D] float32; k, v [B, KVH, L,
// stored row] given by byte strides (the stored row contiguous) and their row types;
// kv_pos [B, L] by strides; q_pos [B]; out [B, H, D] float32.
// Tasks are (sequence, KV head) pairs, t = b * KVH + h.
struct DecodeAttention {
  const float* q;
  const uint8_t* k;
  const uint8_t* v;
  int k_type, v_type;  // KvRow
  int64_t k_sb, k_sh, k_sl, v_sb, v_sh, v_sl;  // bytes
  const int64_t* kv_pos;
  int64_t pos_sb, pos_sl;
  const int64_t* q_pos;
  const int64_t* q_seq;  // [B] the key set (of kv_pos, k, v) each query row reads; nullptr: row b reads set b
  int64_t B, H, KVH, L, D;
  int64_t window;  // <= 0: none
  float scale;
  float softcap;  // <= 0: none
  const float* sinks;  // [H] a logit per query head in the softmax, without a value (gpt-oss); nullptr: none
  float* out;
};
// The per-instruction-set entry points (same arithmetic, same results up to float rounding).
#define SLOTSERVE_DECLARE_ISA(ns)                                                                      \
  namespace ns {                                                                                       \
  void quantize_acts(const float* x, int64_t m0, int64_t m1, int64_t K, int8_t* qx, float* dx, float* xs); \
  void float_sums(const float* x, int64_t m0, int64_t m1, int64_t K, float* xs);                        \
  void quantize_wide(const float* x, int64_t m0, int64_t m1, int64_t K, int16_t* x16, float* d16, float* xs); \
  void rms_rows(const float* x, const float* w, int64_t m0, int64_t m1, int64_t D, float eps, float* out); \
  void linear_rows(int type, const uint8_t* w, int64_t n0, int64_t n1, const Acts& a, float* y, int64_t ldy); \
  void dequant_rows(int type, const uint8_t* w, int64_t n0, int64_t n1, int64_t K, float* out);         \
  void decode_attention(const DecodeAttention& a, int64_t t0, int64_t t1);                              \
  void store_rows(int type, const float* x, int64_t ldx, int64_t D, const int64_t* rows, int64_t i0, int64_t i1, \
                  uint8_t* cache, int64_t ldc);                                                          \
  void rope_rows(const float* x, int64_t x_st, int64_t N, int64_t D, const float* cos, const float* sin,  \
                 int64_t t0, int64_t t1, float* out);                                                    \
  void silu_mul_rows(const float* gu, int64_t ld, int64_t F, int64_t t0, int64_t t1, float* out);        \
  void finite_argmax_rows(float* x, int64_t V, int64_t s0, int64_t s1, float bound, int64_t* out);     \
  void delta_step_rows(const float* q, const float* k, const float* v, const float* g, const float* beta,  \
                       float* state, int64_t Dk, int64_t Dv, int64_t t0, int64_t t1, float* y);          \
  void conv_step_rows(const float* x, int64_t ldx, float* window, const float* w, const float* bias,       \
                      int64_t C, int64_t K, int64_t r0, int64_t r1, float* out);                         \
  void float_rows(const float* x, int64_t ldx, const float* w, const float* bias, int64_t N, int64_t K,    \
                  int64_t i0, int64_t i1, float* y);                                                     \
  int64_t packed_group_bytes(int type, int64_t K);                                                      \
  void pack_groups(int type, const uint8_t* w, int64_t g0, int64_t g1, int64_t K, uint8_t* out);        \
  void packed_dequant_groups(int type, const uint8_t* p, int64_t g0, int64_t g1, int64_t K, float* out); \
  void quantize_q8(const float* x, int64_t m0, int64_t m1, int64_t K, int group, int8_t* qx, float* dx32, \
                   float* isum16, float* isum32);                                                        \
  void packed_rows(int type, const uint8_t* w, int64_t g0, int64_t g1, const PackedActs& a, float* y,     \
                   int64_t ldy);                                                                         \
  }

SLOTSERVE_DECLARE_ISA(portable)
SLOTSERVE_DECLARE_ISA(avx2)
SLOTSERVE_DECLARE_ISA(avx512)

}  // namespace slotserve
