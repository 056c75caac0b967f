// attention_core.h without torch, on whatever ISA this is built for: every task's bits against a scalar reference
// written here from the order the header states, and within rounding of the same attention in double precision.
// Prints one line, `hash <hex>` (FNV-1a of every output's bits), which must be the same for every build: native
// (AVX2 or AVX-512 on x86), scalar (-mno-avx2 -mno-fma) and aarch64 (NEON, under qemu-aarch64). Exits 1 on any
// mismatch, with the case on stderr.
//
//   g++ -O2 -std=c++17 -ffp-contract=off -I common/numerics/native common/numerics/native/test/attention_test.cpp
//
// Inputs come from an integer generator turned into floats exactly, so every platform draws the same numbers.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "attention_core.h"

namespace {

struct Bf16 {
  uint16_t x;
};

struct F32 {  // float in, float out
  static float widen(float x) { return x; }
  static float narrow(float x) { return x; }
};

struct BF {  // bfloat16: float32's upper half; narrowing rounds to nearest even, as torch does
  static float widen(Bf16 x) {
    const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static Bf16 narrow(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if (f != f) return Bf16{0x7FC0};
    return Bf16{static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
  }
};

uint64_t state = 0x9E3779B97F4A7C15ull;
uint64_t next() {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
float uniform(float scale) {  // in [-scale, scale), exactly representable: a 24-bit integer times a power of two
  return static_cast<float>(static_cast<int32_t>(next() >> 40) - (1 << 23)) * (scale / 8388608.0f);
}

// The reference: the header's order, one key at a time, written out plainly.
template <typename Cvt, typename T>
void reference(const T* q, int group, int d, const T* k, const T* v, const int64_t* chunks, int64_t head_offset,
               int64_t chunk_len, int64_t keys, float scale, T* out) {
  auto row = [&](const T* base, int64_t j) { return base + ((chunks[j / chunk_len] + head_offset) * chunk_len +
                                                            j % chunk_len) * d; };
  for (int g = 0; g < group; ++g) {
    std::vector<float> w(keys), o(d, 0.0f);
    for (int64_t j = 0; j < keys; ++j) {
      float lane[16] = {0};
      const int whole = d / 16 * 16;
      for (int i = 0; i < whole; ++i)
        lane[i % 16] = std::fma(Cvt::widen(q[g * d + i]), Cvt::widen(row(k, j)[i]), lane[i % 16]);
      for (int half = 8; half >= 1; half /= 2)
        for (int l = 0; l < half; ++l) lane[l] = lane[l] + lane[l + half];
      float s = lane[0];
      for (int i = whole; i < d; ++i) s = std::fma(Cvt::widen(q[g * d + i]), Cvt::widen(row(k, j)[i]), s);
      w[j] = s;
    }
    float m = w[0];
    for (float s : w) m = s > m ? s : m;
    float l = 0.0f;
    for (int64_t j = 0; j < keys; ++j) w[j] = stepwise::attn::exp_nonpositive((w[j] - m) * scale), l += w[j];
    for (int64_t j = 0; j < keys; ++j)
      for (int i = 0; i < d; ++i) o[i] = std::fma(w[j], Cvt::widen(row(v, j)[i]), o[i]);
    for (int i = 0; i < d; ++i) out[g * d + i] = Cvt::narrow(o[i] / l);
  }
}

uint64_t hash = 0xCBF29CE484222325ull;
void mix(const void* p, size_t n) {
  for (size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001B3ull;
}
int failures = 0;
void fail(const char* what, int c, int d, int group, int64_t chunk_len, int64_t keys) {
  if (++failures <= 10)
    std::fprintf(stderr, "case %d (d %d, group %d, chunk_len %lld, keys %lld): %s\n", c, d, group,
                 static_cast<long long>(chunk_len), static_cast<long long>(keys), what);
}

template <typename Cvt, typename T>
void run_case(int c, bool bf16) {
  const int dims[] = {16, 32, 48, 64, 64, 64, 128, 8, 24, 72, 20};
  const int groups[] = {1, 3, 3, 4, 8};
  const int64_t chunk_lens[] = {1, 4, 16, 48, 128};
  const float scales[] = {0.1f, 1.0f, 8.0f};
  const int d = dims[below(11)], group = groups[below(5)];
  const int64_t chunk_len = chunk_lens[below(5)], keys = 1 + below(c % 4 == 0 ? 400 : 70);
  const float value_scale = scales[below(3)], scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The storage holds two KV heads' chunks, head 1's `spread` chunks after head 0's; this sequence's chunks are
  // a random pick of them, in random order.
  const int64_t width = (keys + chunk_len - 1) / chunk_len, spread = width + 3, stored = 2 * spread;
  std::vector<T> k(stored * chunk_len * d), v(k.size()), q(group * d), out(group * d), fast(group * d),
      ref(group * d);
  for (auto* data : {&k, &v, &q})
    for (auto& x : *data) x = Cvt::narrow(uniform(value_scale));
  std::vector<int64_t> chunks(spread);
  for (int64_t i = 0; i < spread; ++i) chunks[i] = i;
  for (int64_t i = spread - 1; i > 0; --i) std::swap(chunks[i], chunks[below(static_cast<int>(i) + 1)]);
  const int64_t head_offset = below(2) * spread;
  std::vector<float> scratch;
  stepwise::attn::attend_portable<Cvt>(q.data(), group, d, k.data(), v.data(), chunks.data(), head_offset, chunk_len,
                                       keys, scale, scratch, out.data());
  stepwise::attn::attend<Cvt>(q.data(), group, d, k.data(), v.data(), chunks.data(), head_offset, chunk_len, keys,
                              scale, scratch, fast.data());
  reference<Cvt>(q.data(), group, d, k.data(), v.data(), chunks.data(), head_offset, chunk_len, keys, scale,
                 ref.data());
  if (std::memcmp(out.data(), ref.data(), out.size() * sizeof(T)) != 0) fail("portable != reference", c, d, group,
                                                                              chunk_len, keys);
  if (std::memcmp(fast.data(), ref.data(), out.size() * sizeof(T)) != 0) fail("vector != reference", c, d, group,
                                                                               chunk_len, keys);
  // Within rounding of double precision: the error of float sums over d products and `keys` weights, then the
  // output's own rounding (2^-9 relative in bfloat16).
  for (int g = 0; g < group; ++g) {
    std::vector<double> w(keys);
    double m = -1e300, l = 0.0;
    auto at = [&](const std::vector<T>& x, int64_t j, int i) {
      return static_cast<double>(Cvt::widen(x[((chunks[j / chunk_len] + head_offset) * chunk_len + j % chunk_len) *
                                              d + i]));
    };
    for (int64_t j = 0; j < keys; ++j) {
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += static_cast<double>(Cvt::widen(q[g * d + i])) * at(k, j, i);
      w[j] = s, m = s > m ? s : m;
    }
    for (auto& x : w) x = std::exp((x - m) * scale), l += x;
    for (int i = 0; i < d; ++i) {
      double o = 0.0;
      for (int64_t j = 0; j < keys; ++j) o += w[j] * at(v, j, i);
      o /= l;
      const double tol = 2e-4 * value_scale + (bf16 ? std::fabs(o) / 256.0 : 1e-6 * std::fabs(o));
      if (std::fabs(static_cast<double>(Cvt::widen(fast[g * d + i])) - o) > tol)
        fail("farther from double precision than rounding", c, d, group, chunk_len, keys);
    }
  }
  mix(fast.data(), fast.size() * sizeof(T));
}

}  // namespace

int main() {
  for (float x = -100.0f; x <= 0.0f; x += 0.0137f) {  // the exponential against libm, within a few ulp
    const double want = std::exp(static_cast<double>(x)), got = stepwise::attn::exp_nonpositive(x);
    if (x > -87.0f && std::fabs(got - want) > 4.0 * want * 1.2e-7) {
      std::fprintf(stderr, "exp_nonpositive(%g) = %.9g, exp = %.9g\n", x, got, want);
      ++failures;
      break;
    }
  }
  for (int c = 0; c < 300; ++c) {
    if (c % 2 == 0)
      run_case<F32, float>(c, false);
    else
      run_case<BF, Bf16>(c, true);
  }
  if (failures) {
    std::fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  std::printf("hash %016llx\n", static_cast<unsigned long long>(hash));
  return 0;
}
