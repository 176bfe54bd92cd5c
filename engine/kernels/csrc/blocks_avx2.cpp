// The block kernels for CPUs with AVX2, FMA and F16C (chosen at run time by quant.cpp).
// The standard headers come before the target pragma, so that what they instantiate here
// (shared with the portable unit by the linker) stays portable code.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC target("avx2,fma,f16c")
#define SLOTSERVE_ISA avx2
#define SLOTSERVE_AVX2 1
#include "blocks_impl.inc"
