// The block kernels in portable C++ (any CPU; same arithmetic as the AVX2 ones).
#define SLOTSERVE_ISA portable
#define SLOTSERVE_AVX2 0
#include "blocks_impl.inc"
