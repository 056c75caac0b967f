// The portable linear's packed weights (linear_portable.h reads them), laid out once at load. Torch-free, so the
// standalone test (native/test/linear_test.cpp) packs exactly as the engine does.
//
// Every layout cuts the outputs into blocks of 16 (zero padded) and pads the inputs with zeros to kp, a multiple
// of 32, as the AVX-512 kernels' `pack` does: a zero input times a zero weight adds +0, so the padded sum is the
// AVX-512 kernel's to the bit. Within a block, the 16 outputs' weights of one input (or input pair) are adjacent:
// a 64-byte line holds what the kernel multiplies next, outputs 0-7 in its first half, 8-15 in its second (one
// AVX2 register, two NEON ones).
//   bfloat16  [block][kp / 2][16][2]  a line: 16 outputs x an input pair (even input in the low half); the layout
//                                     of linear.cpp's `pack` with interleave 1
//   float32   [block][kp][16]         a line: 16 outputs x 1 input
//   int8      [block][kp][16]         a line: 16 outputs x 4 inputs, plain two's complement
//   int4      [block][kp / 32][320]   (and w4a8) one record per block and Q4_1 group (32 inputs): the 16 outputs' fp16 d,
//                                     their fp16 m, then 256 code bytes: 8 runs of 32 bytes, run 2 c + h for
//                                     inputs 8c .. 8c + 7 of outputs 8h .. 8h + 7, each output a 32-bit word
//                                     holding input 8c + t in bits 4t .. 4t + 3 (little-endian)
#pragma once

#include <cstdint>

namespace stepwise_portable {

constexpr int64_t BLOCK = 16, K_ALIGN = 32, GROUP = 32, INT4_RECORD = 320;
enum class Kind { bf16, f32, int8, int4, w4a8 };  // w4a8: int4's records, int8 activations

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
inline int64_t padded_inputs(int64_t k) { return round_up(k, K_ALIGN); }
inline int64_t block_count(int64_t n) { return (n + BLOCK - 1) / BLOCK; }

// Bytes of one block of a packed weight with kp (padded) inputs.
inline int64_t block_bytes(Kind kind, int64_t kp) {
  switch (kind) {
    case Kind::bf16: return kp * BLOCK * 2;
    case Kind::f32: return kp * BLOCK * 4;
    case Kind::int8: return kp * BLOCK;
    default: return kp / GROUP * INT4_RECORD;
  }
}

// Where weight (o, i) of a bfloat16, float32 or int8 weight lies in the packed copy, in elements.
inline int64_t packed_index(Kind kind, int64_t kp, int64_t o, int64_t i) {
  const int64_t block = o / BLOCK, lane = o % BLOCK;
  if (kind == Kind::bf16) return ((block * (kp / 2) + i / 2) * BLOCK + lane) * 2 + i % 2;
  return (block * kp + i) * BLOCK + lane;
}

// weight [n, k] (bfloat16 bits, float32 or int8) -> the packed layout; `out` holds block_count(n) blocks, and is
// zeroed here first.
template <typename T>
void pack_dense(Kind kind, const T* weight, int64_t n, int64_t k, T* out) {
  const int64_t kp = padded_inputs(k), total = block_count(n) * BLOCK * kp;
  for (int64_t e = 0; e < total; ++e) out[e] = T{};
  for (int64_t o = 0; o < n; ++o)
    for (int64_t i = 0; i < k; ++i) out[packed_index(kind, kp, o, i)] = weight[o * k + i];
}

// Q4_1 groups -> records: codes [n, k] (0..15), d and m [n, k / 32] (float16 bits); k a multiple of 32.
inline void pack_int4(const uint8_t* codes, const uint16_t* d, const uint16_t* m, int64_t n, int64_t k, uint8_t* out) {
  const int64_t groups = k / GROUP, blocks = block_count(n);
  for (int64_t e = 0; e < blocks * groups * INT4_RECORD; ++e) out[e] = 0;
  for (int64_t o = 0; o < n; ++o) {
    const int64_t block = o / BLOCK, lane = o % BLOCK, h = lane / 8, j = lane % 8;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* record = out + (block * groups + g) * INT4_RECORD;
      for (int b = 0; b < 2; ++b) {
        record[2 * lane + b] = static_cast<uint8_t>(d[o * groups + g] >> (8 * b));
        record[32 + 2 * lane + b] = static_cast<uint8_t>(m[o * groups + g] >> (8 * b));
      }
      for (int64_t i = 0; i < GROUP; ++i) {  // input 8 c + t of the group
        const int64_t c = i / 8, t = i % 8;
        uint8_t& byte = record[64 + 32 * (2 * c + h) + 4 * j + t / 2];
        byte = static_cast<uint8_t>(byte | (codes[o * k + g * GROUP + i] & 15) << (4 * (t % 2)));
      }
    }
  }
}

// A code of a record (for reading weights back): output `lane` (0..15), input i (0..31) of the group.
inline int int4_code(const uint8_t* record, int64_t lane, int64_t i) {
  const int64_t c = i / 8, t = i % 8;
  return record[64 + 32 * (2 * c + lane / 8) + 4 * (lane % 8) + t / 2] >> (4 * (t % 2)) & 15;
}

}  // namespace stepwise_portable
