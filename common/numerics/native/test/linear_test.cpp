// The portable linear (../linear_portable.h) alone, no torch: for each weight kind (bfloat16, float32, int8, int4,
// w4a8) and shapes with ragged outputs and inputs, every row's bits
//   * equal a scalar reference written here from the unpacked weights: std::fma in the order the header states;
//   * lie within rounding of the sum in double precision (the kernel computes a linear at all; w4a8 within its
//     inputs' rounding to 8 bits besides);
//   * are the same alone and inside every call of 1..40 rows, and whatever the split of the outputs over threads.
// It prints a hash of every output: run.sh builds this natively, for the scalar path and for aarch64 (under
// qemu), and fails unless all hashes are equal. Inputs come from an integer generator, so every build sees the
// same numbers; no NaN or infinity (their payloads are the one thing ISAs may choose differently).
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "linear_portable.h"

namespace sp = stepwise_portable;
using sp::Kind;

namespace {

uint64_t state = 0x9E3779B97F4A7C15ull;
uint64_t next() {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// The bits of a random float with its exponent in [lo, hi] (powers of two), its mantissa `bits` wide, random sign.
// (Bits, not floats: GCC 12.2 at -O1 and above dropped the mask of `to_bits(v) & 0xFFFF0000u` where v was picked
// from 0.0f, -0.0f or a random float; this test's own hashes differed between builds and showed it.)
uint32_t random_bits(int lo, int hi, int bits) {
  const uint64_t r = next();
  const uint32_t exponent = static_cast<uint32_t>(127 + lo + static_cast<int>(r % (hi - lo + 1)));
  const uint32_t mantissa = static_cast<uint32_t>(r >> 20) & ((1u << bits) - 1);
  return static_cast<uint32_t>((r >> 60) & 1) << 31 | exponent << 23 | mantissa << (23 - bits);
}
float random_float(int lo, int hi, int bits) { return from_bits(random_bits(lo, hi, bits)); }

// The rounding of VCVTNEPS2BF16, written from Intel's pseudo-code (independently of the header's).
uint16_t reference_bf16(float f) {
  const uint32_t u = to_bits(f);
  if (f == 0 || std::fabs(f) < FLT_MIN) return static_cast<uint16_t>((u >> 31) << 15);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
double half_value(uint16_t h) {  // float16 bits -> value (finite only)
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

struct Case {
  Kind kind;
  int64_t n, k;
  std::vector<float> w;  // [n][k] the weights' values (int8: q; int4: the codes)
  std::vector<uint16_t> wbits, d, m;  // bfloat16 bits; int4's and w4a8's d and m (float16 bits) [n][k / 32]
  std::vector<float> scale;  // int8
  std::vector<float> x;  // [rows][kp], zero from k
};

const int ROWS = 40;

Case make_case(Kind kind, int64_t n, int64_t k) {
  Case c;
  c.kind = kind, c.n = n, c.k = k;
  const int64_t kp = sp::padded_inputs(k);
  c.w.resize(n * k), c.wbits.resize(n * k), c.x.assign(ROWS * kp, 0.0f);
  for (int64_t e = 0; e < n * k; ++e) {
    if (kind == Kind::bf16) c.wbits[e] = static_cast<uint16_t>(random_bits(-9, 0, 7) >> 16), c.w[e] = from_bits(uint32_t{c.wbits[e]} << 16);
    else if (kind == Kind::f32) c.w[e] = random_float(-9, 0, 23);
    else if (kind == Kind::int8) c.w[e] = static_cast<float>(static_cast<int>(next() % 255) - 127);
    else c.w[e] = static_cast<float>(next() % 16);
  }
  const bool groups = kind == Kind::int4 || kind == Kind::w4a8;
  if (kind == Kind::int8)
    for (int64_t o = 0; o < n; ++o) c.scale.push_back(random_float(-12, -5, 7));
  if (groups)
    for (int64_t e = 0; e < n * (k / 32); ++e) {  // float16: d in [2^-10, 2^-4), m = -8 d or so, some subnormal
      c.d.push_back(static_cast<uint16_t>((5 + next() % 6) << 10 | (next() % 1024)));
      c.m.push_back(static_cast<uint16_t>(0x8000 | (e % 7 == 0 ? next() % 1024 : (8 + next() % 6) << 10 | (next() % 1024))));
    }
  const bool bf16_x = kind != Kind::f32;
  for (int r = 0; r < ROWS; ++r) {
    float* x = &c.x[r * kp];
    for (int64_t i = 0; i < k; ++i) {
      const uint32_t v = r == 3 ? 0u : r == 4 ? 0x80000000u  // zeros; sums near and below FLT_MIN; the rest
                         : r == 5 ? random_bits(-126, -118, 23) : random_bits(-6, 4, 23);
      x[i] = from_bits(bf16_x ? v & 0xFFFF0000u : v);
    }
    // Order-revealing rows: +B w and later -B w (B = 2^20, equal weights below): every product in between is
    // rounded against a partial sum of about B |w|, so a change in the order of any of them shows in the result.
    // int4: both inside group 0, so its chain `part` shows the order of its pairs.
    const int64_t last = kind == Kind::int4 ? 30 : k - 2;
    if (r % 4 == 1 && k >= 4 && kind != Kind::w4a8) x[1] = 1048576.0f, x[last] = -1048576.0f;
    // w4a8: a group whose largest |x| is a power of two, and one whose inputs are all equal (their codes' ties)
    if (kind == Kind::w4a8 && r == 1) x[5] = 64.0f;
    if (kind == Kind::w4a8 && r == 2) std::fill(x, x + std::min<int64_t>(k, 32), -0.375f);
    // int4, a row whose group 1 is minus its group 0 (and nothing after): groups 0 and 1 of every output are
    // equal below, so the output is what the roundings of those two groups leave: it shows how d, m, part and
    // the group's sum of x were combined.
    if (kind == Kind::int4 && r == 6 && k >= 64)
      for (int64_t i = 32; i < k; ++i) x[i] = i < 64 ? -x[i - 32] : 0.0f;
  }
  const int64_t last = kind == Kind::int4 ? 30 : k - 2;
  for (int64_t o = 0; o < n && k >= 4; ++o) {  // weight (o, last) = weight (o, 1)
    c.w[o * k + last] = c.w[o * k + 1];
    c.wbits[o * k + last] = c.wbits[o * k + 1];
    for (int64_t i = 32; i < 64 && kind == Kind::int4 && k >= 64; ++i) c.w[o * k + i] = c.w[o * k + i - 32];
    if (kind == Kind::int4 && k >= 64) c.d[o * (k / 32) + 1] = c.d[o * (k / 32)], c.m[o * (k / 32) + 1] = c.m[o * (k / 32)];
  }
  return c;
}

// Row r's outputs by the stated order, from the unpacked weights; `exact` the sum in double, `bound` its error.
void reference(const Case& c, int r, std::vector<uint32_t>& bits, std::vector<double>& exact, std::vector<double>& bound) {
  const int64_t kp = sp::padded_inputs(c.k), groups = c.k / 32;
  const float* x = &c.x[r * kp];
  bits.assign(c.n, 0), exact.assign(c.n, 0), bound.assign(c.n, 0);
  for (int64_t o = 0; o < c.n; ++o) {
    double sum = 0, magnitude = 0, quantized = 0;
    float acc = 0.0f;
    if (c.kind == Kind::w4a8) {
      for (int64_t g = 0; g < groups; ++g) {  // the definition in linear_portable_w4a8.h, one input at a time
        const float* xg = x + 32 * g;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::fabs(xg[i]) > amax ? std::fabs(xg[i]) : amax;
        const bool zero = !(amax >= 0x1p-100f);
        const float inv = zero ? 0.0f : 127.0f / amax, s = zero ? 0.0f : amax / 127.0f;
        int64_t dot = 0, count = 0;
        double wsum = 0, err = 0;
        const double d = half_value(c.d[o * groups + g]), mn = half_value(c.m[o * groups + g]);
        for (int i = 0; i < 32; ++i) {
          const float q = c.w[o * c.k + 32 * g + i];
          const int a = zero ? 0 : static_cast<int>(std::nearbyint(xg[i] * inv));
          dot += a * static_cast<int64_t>(q), count += a;
          const double w = d * q + mn;
          sum += static_cast<double>(xg[i]) * w, wsum += std::fabs(w);
          magnitude += (std::fabs(xg[i]) + amax / 127.0) * std::fabs(w) + std::fabs(d * q * xg[i]) + std::fabs(mn * xg[i]);
          err += std::fabs(xg[i]) * std::ldexp(1.0, -20) * std::fabs(w);
        }
        err += (zero ? amax : amax / 254.0) * wsum;  // each input moved by at most half a step (all of it if zeroed)
        quantized += err;
        acc = std::fma(static_cast<float>(mn), s * static_cast<float>(count),
                       std::fma(static_cast<float>(d) * s, static_cast<float>(dot), acc));
      }
    } else if (c.kind != Kind::int4) {
      for (int64_t i = 0; i < kp; ++i) {
        const float w = i < c.k ? c.w[o * c.k + i] : 0.0f;
        acc = std::fma(x[i], w, acc);
        sum += static_cast<double>(x[i]) * w, magnitude += std::fabs(static_cast<double>(x[i]) * w);
      }
    } else {
      for (int64_t g = 0; g < groups; ++g) {
        const float* xg = x + 32 * g;
        float part = 0.0f, v[16], t[8], u[4];
        double dot = 0, dot_abs = 0, xs = 0, xs_abs = 0;
        for (int p = 0; p < 16; ++p)
          for (int i : {2 * p + 1, 2 * p}) {
            const float q = c.w[o * c.k + 32 * g + i];
            part = std::fma(xg[i], q, part);
            dot += static_cast<double>(xg[i]) * q, dot_abs += std::fabs(xg[i]) * q;
            xs += xg[i], xs_abs += std::fabs(xg[i]);
          }
        for (int i = 0; i < 16; ++i) v[i] = xg[i] + xg[i + 16];
        for (int i = 0; i < 8; ++i) t[i] = v[i] + v[i + 8];
        for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
        const float group_sum = (u[0] + u[2]) + (u[1] + u[3]);
        const double d = half_value(c.d[o * groups + g]), mn = half_value(c.m[o * groups + g]);
        acc = std::fma(static_cast<float>(mn), group_sum, std::fma(static_cast<float>(d), part, acc));
        sum += d * dot + mn * xs, magnitude += std::fabs(d) * dot_abs + std::fabs(mn) * xs_abs;
      }
    }
    const double s = c.kind == Kind::int8 ? c.scale[o] : 1.0;
    const float y = c.kind == Kind::int8 ? acc * c.scale[o] : acc;
    bits[o] = c.kind == Kind::f32 ? to_bits(y) : reference_bf16(y);
    exact[o] = sum * s;
    // float32 chains: one rounding per step, each at most 2^-24 of what is summed so far; then the last rounding
    bound[o] = (static_cast<double>(kp + 2 * groups + 2) * std::ldexp(1.0, -24) * magnitude * std::fabs(s)) * 1.01 +
               static_cast<double>(kp + 2 * groups + 2) * std::ldexp(1.0, -149) +  // subnormal steps: absolute
               (c.kind == Kind::f32 ? 0.0 : std::ldexp(std::fabs(exact[o]), -8) + FLT_MIN) + quantized * 1.01;
  }
}

struct Packed {
  std::vector<char> bytes;
  std::vector<float> sums;
  std::vector<int8_t> qa;  // w4a8: every row quantized
  std::vector<float> qs;
};

Packed pack(const Case& c) {
  const int64_t kp = sp::padded_inputs(c.k), blocks = sp::block_count(c.n);
  Packed p;
  p.bytes.resize(blocks * sp::block_bytes(c.kind, kp));
  if (c.kind == Kind::bf16) sp::pack_dense(c.kind, c.wbits.data(), c.n, c.k, reinterpret_cast<uint16_t*>(p.bytes.data()));
  if (c.kind == Kind::f32) sp::pack_dense(c.kind, c.w.data(), c.n, c.k, reinterpret_cast<float*>(p.bytes.data()));
  if (c.kind == Kind::int8) {
    std::vector<int8_t> q(c.w.begin(), c.w.end());
    sp::pack_dense(c.kind, q.data(), c.n, c.k, reinterpret_cast<int8_t*>(p.bytes.data()));
  }
  if (c.kind == Kind::int4 || c.kind == Kind::w4a8) {
    std::vector<uint8_t> codes(c.w.begin(), c.w.end());
    sp::pack_int4(codes.data(), c.d.data(), c.m.data(), c.n, c.k, reinterpret_cast<uint8_t*>(p.bytes.data()));
    p.sums.resize(ROWS * (kp / 32));
    sp::group_sums(c.x.data(), ROWS, kp, kp / 32, p.sums.data());
  }
  if (c.kind == Kind::w4a8) {
    p.qa.resize(ROWS * kp), p.qs.resize(ROWS * (kp / 32) * 2);
    sp::quantize_rows(c.x.data(), ROWS, kp, kp, p.qa.data(), p.qs.data());
  }
  return p;
}

// Rows [row0, row0 + rows) through the kernel, outputs split over `splits` (pretend threads) at block `cut`.
std::vector<uint32_t> run(const Case& c, const Packed& p, int row0, int rows, int64_t cut, bool parallel) {
  const int64_t kp = sp::padded_inputs(c.k), blocks = sp::block_count(c.n);
  std::vector<float> f32(c.kind == Kind::f32 ? rows * c.n : 0);
  std::vector<uint16_t> bf16(c.kind == Kind::f32 ? 0 : rows * c.n);
  sp::Problem pr{c.kind, c.x.data() + row0 * kp, rows, kp, kp, c.n, p.bytes.data(),
                 c.scale.empty() ? nullptr : c.scale.data(),
                 p.sums.empty() ? nullptr : p.sums.data() + row0 * (kp / 32),
                 c.kind == Kind::f32 ? static_cast<void*>(f32.data()) : static_cast<void*>(bf16.data()),
                 p.qa.empty() ? nullptr : p.qa.data() + row0 * kp,
                 p.qs.empty() ? nullptr : p.qs.data() + row0 * (kp / 32) * 2};
  if (parallel) {
    sp::linear(pr);
  } else {
    sp::linear_blocks(pr, 0, cut);
    sp::linear_blocks(pr, cut, blocks);
  }
  std::vector<uint32_t> out(rows * c.n);
  for (int64_t e = 0; e < rows * c.n; ++e) out[e] = c.kind == Kind::f32 ? to_bits(f32[e]) : bf16[e];
  return out;
}

int failures = 0;
void fail(const char* what, const Case& c, int row, int64_t o, uint32_t got, uint32_t want) {
  if (++failures <= 10)
    std::printf("FAIL %s: kind %d, %lld x %lld, row %d, output %lld: %08x, expected %08x\n", what,
                static_cast<int>(c.kind), static_cast<long long>(c.n), static_cast<long long>(c.k), row,
                static_cast<long long>(o), got, want);
}

double value(Kind kind, uint32_t bits) { return kind == Kind::f32 ? from_bits(bits) : from_bits(bits << 16); }

}  // namespace

int main() {
  const char* names[] = {"bfloat16", "float32", "int8", "int4", "w4a8"};
  const int64_t dense[][2] = {{1, 32}, {16, 32}, {33, 70}, {100, 96}, {70, 200}, {24, 576}};
  const int64_t groups[][2] = {{1, 32}, {16, 32}, {33, 64}, {100, 96}, {70, 192}, {24, 576}};
  uint64_t hash = 1469598103934665603ull, checks = 0;  // FNV-1a over every row's outputs alone
  for (Kind kind : {Kind::bf16, Kind::f32, Kind::int8, Kind::int4, Kind::w4a8}) {
    uint64_t kind_hash = 1469598103934665603ull;
    for (const auto& shape : kind == Kind::int4 || kind == Kind::w4a8 ? groups : dense) {
      const Case c = make_case(kind, shape[0], shape[1]);
      const Packed p = pack(c);
      const int64_t blocks = sp::block_count(c.n);
      std::vector<std::vector<uint32_t>> alone(ROWS);
      std::vector<uint32_t> want;
      std::vector<double> exact, bound;
      for (int r = 0; r < ROWS; ++r) {
        alone[r] = run(c, p, r, 1, blocks / 2, false);
        reference(c, r, want, exact, bound);
        for (int64_t o = 0; o < c.n; ++o, ++checks) {
          if (alone[r][o] != want[o]) fail("not the reference's bits", c, r, o, alone[r][o], want[o]);
          if (!(std::fabs(value(kind, alone[r][o]) - exact[o]) <= bound[o]))
            fail("not within rounding of the double sum", c, r, o, alone[r][o], want[o]);
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = static_cast<uint8_t>(alone[r][o] >> (8 * b));
            hash = (hash ^ byte) * 1099511628211ull, kind_hash = (kind_hash ^ byte) * 1099511628211ull;
          }
        }
      }
      for (int rows = 1; rows <= ROWS; ++rows) {  // every call size, from a few starts, split at a few blocks
        const int row0 = (rows * 7) % (ROWS - rows + 1);
        const std::vector<uint32_t> got = run(c, p, row0, rows, (rows * 5) % (blocks + 1), rows % 8 == 0);
        for (int r = 0; r < rows; ++r)
          for (int64_t o = 0; o < c.n; ++o, ++checks)
            if (got[r * c.n + o] != alone[row0 + r][o]) fail("a row's bits change in a call", c, row0 + r, o,
                                                             got[r * c.n + o], alone[row0 + r][o]);
      }
    }
    std::printf("%-8s hash %016llx\n", names[static_cast<int>(kind)], static_cast<unsigned long long>(kind_hash));
  }
  std::printf("linear_test (%s, dot %s): %llu checks, %d failures\n", sp::ISA, sp::DOT_ISA, static_cast<unsigned long long>(checks), failures);
  std::printf("hash %016llx\n", static_cast<unsigned long long>(hash));
  return failures ? 1 : 0;
}
