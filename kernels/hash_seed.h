// hash_seed.h -- the secret seed of the engines' hash tables.
//
// The engines find bitwise-identical rows with open-addressing tables keyed
// by a 64-bit hash of each row's bits (cpu/ti_distinct.cpp,
// cuda/ti_spatial_order.cu), and number group ids the same way
// (group_split.cpp). The keys come from the user's data: with a fixed hash
// function anyone could compute many distinct keys of one hash (or one
// table slot) and make every lookup walk all of them, a join quadratic in
// its rows that no cancel interrupts. Starting every hash from a seed drawn
// from the kernel's random source once per process makes such keys
// impossible to compute without the seed, which never leaves the process.
// Exactness never depends on the seed: equal hashes are confirmed.
#pragma once

#include <sys/random.h>

#include <chrono>
#include <cstdint>

namespace knn {

inline uint64_t hash_seed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof s)) {
      // No entropy yet (early boot): the clock, mixed (splitmix64's finaliser).
      s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
          reinterpret_cast<uintptr_t>(&s);
      s = (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9ULL;
      s = (s ^ (s >> 27)) * 0x94d049bb133111ebULL;
      s ^= s >> 31;
    }
    return s;
  }();
  return seed;
}

}  // namespace knn
