// The portable linear (../linear_portable.h) timed alone, no torch, against this core's own ceiling: `make
// native-bench`. Where the engine's figures mix kernels, Python and a noisy machine, this shows what the kernel
// itself does with the hardware, on any machine the header builds on (AVX2, NEON, scalar).
//
// Two ceilings, both measured here:
//   * arithmetic: `peak`, a loop of nothing but independent 8-lane multiply-adds (the kernel's one instruction
//     that counts), in multiply-adds a second; at 64 rows each weight read serves 64 rows, so a linear is bound
//     by this one (w4a8 is not: its integer instruction does 4 inputs a lane, so it can pass 100%);
//   * memory: at one row each weight is read once for one multiply-add, so a linear is bound by how fast its
//     weights arrive (GB/s: 2, 1 or 0.625 bytes a weight). The weights of one shape fit in cache here, so this
//     is the kernel's cost of turning bytes into products, not DRAM's (the ladder measures that).
// And one check: a row's outputs are the same bits alone as in the call of 64 rows.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "linear_portable.h"

namespace sp = stepwise_portable;
using sp::Kind;

namespace {

uint64_t state = 0x9E3779B97F4A7C15ull;
uint32_t next() { state = state * 6364136223846793005ull + 1442695040888963407ull; return static_cast<uint32_t>(state >> 33); }

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

template <typename F>
double seconds_per_call(F&& f) {  // repeat for at least 0.2 s after one warm call
  f();
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    f(), ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < 0.2);
  return elapsed / calls;
}

// Multiply-adds a second on one core: 12 independent chains (enough to cover the FMA latency on every ISA here).
double peak() {
  sp::V8 acc[12];
  for (auto& a : acc) a = sp::zero();
  const sp::V8 x = sp::broadcast(1.0f + 1e-7f), w = sp::broadcast(1e-9f);
  const int64_t steps = 20'000'000;
  const double s = seconds_per_call([&] {
    for (int64_t i = 0; i < steps / 12; ++i)
      for (auto& a : acc) a = sp::fma(x, w, a);
  });
  float sink[8], total = 0;  // every chain's result used, or the compiler drops the chains it can see are dead
  for (auto& a : acc) sp::store(sink, a), total += sink[0];
  return total == -1 ? 0 : steps / 12 * 12 * 8.0 / s;
}

struct Weights {
  Kind kind;
  int64_t n, k;
  std::vector<char> packed;
  std::vector<float> scale;
};

Weights make(Kind kind, int64_t n, int64_t k) {
  Weights w{kind, n, k, std::vector<char>(sp::block_count(n) * sp::block_bytes(kind, sp::padded_inputs(k))),
            std::vector<float>(n, 0.01f)};
  if (kind == Kind::int4 || kind == Kind::w4a8) {
    std::vector<uint8_t> codes(n * k);
    std::vector<uint16_t> d(n * k / 32), m(n * k / 32);
    for (auto& c : codes) c = next() & 15;
    for (auto& v : d) v = static_cast<uint16_t>(0x2000 | (next() & 0x3FF));  // small positive float16
    for (auto& v : m) v = static_cast<uint16_t>(0xA000 | (next() & 0x3FF));  // small negative float16
    sp::pack_int4(codes.data(), d.data(), m.data(), n, k, reinterpret_cast<uint8_t*>(w.packed.data()));
  } else if (kind == Kind::bf16) {
    std::vector<uint16_t> bits(n * k);
    for (auto& b : bits) b = static_cast<uint16_t>(0x3C00 | (next() & 0x80FF));  // +-(0.0078..0.016)
    sp::pack_dense(kind, bits.data(), n, k, reinterpret_cast<uint16_t*>(w.packed.data()));
  } else {
    std::vector<int8_t> q(n * k);
    for (auto& v : q) v = static_cast<int8_t>(next());
    sp::pack_dense(kind, q.data(), n, k, reinterpret_cast<int8_t*>(w.packed.data()));
  }
  return w;
}

// One call of `rows` rows: its outputs (bfloat16 bits), and the seconds it takes.
std::vector<uint16_t> call(const Weights& w, const std::vector<float>& x, int64_t rows, double* seconds) {
  const int64_t kp = sp::padded_inputs(w.k), groups = kp / sp::GROUP;
  std::vector<float> sums(rows * groups), qs(rows * groups * 2);
  std::vector<int8_t> qa(rows * kp);
  std::vector<uint16_t> out(rows * w.n);
  const sp::Problem p{w.kind, x.data(), rows, kp, kp, w.n, w.packed.data(), w.scale.data(), sums.data(), out.data(),
                      qa.data(), qs.data()};
  auto once = [&] {  // what the engine's call does before the kernel: int4's group sums, or w4a8's int8 rows
    if (w.kind == Kind::w4a8) sp::quantize_rows(x.data(), rows, kp, kp, qa.data(), qs.data());
    else sp::group_sums(x.data(), rows, kp, groups, sums.data());
    sp::linear(p);
  };
  if (seconds) *seconds = seconds_per_call(once);
  else once();
  return out;
}

}  // namespace

int main() {
  const double fma_rate = peak();
  std::printf("portable linear (%s; w4a8's integer sums: %s), %d thread(s); peak of one core: %.1f G multiply-adds/s "
              "(%.1f GFLOP/s)\n\n", sp::ISA, sp::DOT_ISA, threads(), fma_rate / 1e9, 2 * fma_rate / 1e9);
  std::printf("%-8s %-10s %5s %10s %10s %9s %9s  %s\n", "weights", "shape", "rows", "us", "GMAC/s", "of peak",
              "GB/s", "alone = in a call");
  const char* names[] = {"bfloat16", "float32", "int8", "int4", "w4a8"};
  const double bytes[] = {2.0, 4.0, 1.0, 20.0 / 32, 20.0 / 32};
  const int64_t shapes[][2] = {{3072, 576}, {576, 1536}};  // SmolLM2's gate/up and down
  int failures = 0;
  for (Kind kind : {Kind::bf16, Kind::int8, Kind::int4, Kind::w4a8})
    for (const auto& shape : shapes) {
      const Weights w = make(kind, shape[0], shape[1]);
      const int64_t kp = sp::padded_inputs(w.k);
      std::vector<float> x(64 * kp, 0.0f);
      for (int64_t r = 0; r < 64; ++r)
        for (int64_t i = 0; i < w.k; ++i) {  // bfloat16 values, as the engine's rows are
          const uint32_t b = (0x3F00u | (next() & 0x80FFu)) << 16;
          std::memcpy(&x[r * kp + i], &b, 4);
        }
      const std::vector<uint16_t> all = call(w, x, 64, nullptr), first = call(w, x, 1, nullptr);
      const bool same = std::memcmp(all.data(), first.data(), first.size() * 2) == 0;
      failures += !same;
      for (int64_t rows : {1, 8, 64}) {
        double s = 0;
        call(w, x, rows, &s);
        const double macs = static_cast<double>(w.n) * w.k * rows;
        char gb[16] = "-";
        if (rows == 1) std::snprintf(gb, sizeof gb, "%.1f", w.n * w.k * bytes[static_cast<int>(kind)] / s / 1e9);
        std::printf("%-8s %4lldx%-5lld %5lld %10.1f %10.2f %8.0f%% %9s  %s\n", names[static_cast<int>(kind)],
                    static_cast<long long>(w.n), static_cast<long long>(w.k), static_cast<long long>(rows), s * 1e6,
                    macs / s / 1e9, 100 * macs / s / (fma_rate * threads()), gb, same ? "yes" : "NO");
      }
    }
  std::printf("\n'of peak': of %d core(s) at the peak above. On a shared or virtual machine, run it alone: another\n"
              "process on the cores, or the host's, moves every figure.\n", threads());
  return failures ? 1 : 0;
}
