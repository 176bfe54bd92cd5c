// The block kernels for CPUs with AVX-512 VNNI (F, BW, VL, DQ and VNNI; chosen at run
// time by binding.cpp): the AVX2 code, with the integer dot products fused (dpwssd,
// dpbusd: one instruction for a madd and its add) and 32 vector registers. Same integers
// as the AVX2 kernels, so the same results.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define SLOTSERVE_ISA avx512
#define SLOTSERVE_AVX2 1
#define SLOTSERVE_VNNI 1
#include "blocks_impl.inc"
