#include "core/name_index.hpp"

#include <chrono>
#include <cstring>
#include <random>
#include <string>

#include "core/error.hpp"

namespace peft {
namespace {

// The high and low halves of a * b, folded: every input bit reaches the low 32 bits.
uint64_t fold_multiply(uint64_t a, uint64_t b) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

uint64_t draw_seed() {
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    std::random_device device;
    seed ^= (static_cast<uint64_t>(device()) << 32) ^ device();
  } catch (...) {
    // No entropy source: the clock (and the address below) still vary between processes.
  }
  return seed ^ reinterpret_cast<uintptr_t>(&seed);
}

}  // namespace

uint64_t name_hash(std::string_view name) {
  // Odd constants with mixed bits (the fractional digits of pi); the seed enters every step. Sixteen
  // bytes a step, as two words in one 128-bit product, so that the chain of products stays short.
  constexpr uint64_t kLength = 0x243F6A8885A308D3ULL, kFirst = 0x13198A2E03707345ULL,
                     kSecond = 0xA4093822299F31D1ULL, kFinal = 0x082EFA98EC4E6C89ULL;
  static const uint64_t seed = draw_seed();
  const char* p = name.data();
  size_t left = name.size();
  uint64_t h = fold_multiply(seed ^ kLength, left ^ kFinal);
  for (; left > 16; p += 16, left -= 16) {
    uint64_t first, second;
    std::memcpy(&first, p, 8);
    std::memcpy(&second, p + 8, 8);
    h = fold_multiply(first ^ kFirst ^ seed, second ^ kSecond ^ h);
  }
  // The last 1 to 16 bytes (none for an empty name), zero-padded; the length is in h.
  uint64_t tail[2] = {0, 0};
  if (left > 0) std::memcpy(tail, p, left);
  h = fold_multiply(tail[0] ^ kFirst ^ seed, tail[1] ^ kSecond ^ h);
  return fold_multiply(h ^ kFinal, seed ^ kLength);
}

void name_index_position_too_large(size_t position) {
  fail(PEFT_ERR_UNSUPPORTED, "a list of " + std::to_string(position + 1) + " names is longer than the name index "
                             "holds (2^32 - 2)");
}

}  // namespace peft
