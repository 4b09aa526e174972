// Rng: seeded randomness whose sequence is identical on every platform and standard library.
//
// std::*_distribution results differ between library implementations, so the simulator draws
// only through these methods (SplitMix64 core, inverse-transform / Box-Muller on top).
#pragma once

#include <cmath>
#include <cstdint>

namespace gmux::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  // Independent stream for a sub-component (e.g. one tenant), reproducible from (seed, stream).
  Rng Fork(uint64_t stream) const { return Rng(state_ ^ (0x9E3779B97F4A7C15ULL * (stream + 1))); }

  uint64_t NextU64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Exponential with the given mean (mean <= 0 gives 0).
  double Exponential(double mean) {
    if (mean <= 0) return 0;
    return -mean * std::log(1.0 - Uniform());
  }
  // Normal(mean, stddev) by Box-Muller (one draw per call; simple and deterministic).
  double Normal(double mean, double stddev) {
    double u1 = 1.0 - Uniform();
    double u2 = Uniform();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  bool Bernoulli(double p) { return Uniform() < p; }

 private:
  uint64_t state_;
};

}  // namespace gmux::sim
