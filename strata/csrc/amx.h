// What the AMX kernels share (amx_gemm.cpp, amx_attention.cpp): the tile configuration's
// layout and whether this process may use the tiles.
#pragma once

#include <cstdint>

namespace strata {

// The layout _tile_loadconfig reads (palette 1): 64 bytes.
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// This CPU has AMX-TILE and AMX-BF16 (and AVX-512 BF16) and Linux granted the tile state
// (ARCH_REQ_XCOMP_PERM, XTILEDATA); asked once (amx_gemm.cpp).
bool amx_permitted();

}  // namespace strata
