// 64-bit hashing for graph keys. Deterministic across runs (no per-process seed), so a graph's
// key can be printed and compared between processes.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace spmd {

using Hash = uint64_t;

inline Hash HashMix(Hash h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

inline Hash HashCombine(Hash seed, Hash value) {
  return HashMix(seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)));
}

inline Hash HashInt(int64_t v) { return HashMix(static_cast<uint64_t>(v) + 0x632be59bd9b4e019ULL); }

inline Hash HashDouble(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return HashMix(bits ^ 0x85ebca6b);
}

inline Hash HashString(std::string_view s) {
  Hash h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return HashMix(h);
}

inline Hash HashInts(const std::vector<int64_t>& v) {
  Hash h = HashInt(static_cast<int64_t>(v.size()));
  for (int64_t x : v) h = HashCombine(h, HashInt(x));
  return h;
}

}  // namespace spmd
