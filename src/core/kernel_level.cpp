// CPU feature detection for the kernel tables, by CPUID and XGETBV rather than
// __builtin_cpu_supports: that builtin's feature names differ between GCC and clang (clang 14 has no
// "f16c"), and it does not tell whether the OS saves the AVX-512 state.
#include "core/kernel_level.hpp"

#include <cstdlib>
#include <cstring>

#include "core/kernel_target.hpp"

#ifdef PEFT_KERNELS_X86
#include <cpuid.h>
#endif

namespace peft::kernels {
namespace {

#ifdef PEFT_KERNELS_X86
Level detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return Level::portable;
  constexpr unsigned kFma = 1u << 12, kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;
  constexpr unsigned kLeaf1 = kFma | kOsxsave | kAvx | kF16c;
  if ((c & kLeaf1) != kLeaf1) return Level::portable;
  unsigned xcr0 = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0u));
  if ((xcr0 & 0x6u) != 0x6u) return Level::portable;  // XMM and YMM state
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return Level::portable;
  constexpr unsigned kAvx2 = 1u << 5;
  if ((b & kAvx2) == 0) return Level::portable;
  constexpr unsigned kAvx512f = 1u << 16, kAvx512dq = 1u << 17, kAvx512bw = 1u << 30, kAvx512vl = 1u << 31;
  constexpr unsigned kAvx512 = kAvx512f | kAvx512dq | kAvx512bw | kAvx512vl;
  const bool zmm_state = (xcr0 & 0xE0u) == 0xE0u;  // opmask, upper ZMM0-15, ZMM16-31
  return (b & kAvx512) == kAvx512 && zmm_state ? Level::avx512 : Level::avx2;
}
#else
Level detect() { return Level::portable; }
#endif

}  // namespace

Level supported_level() {
  static const Level level = detect();
  return level;
}

Level choose_level(const char* request, Level supported) {
  Level wanted = supported;
  if (request != nullptr) {
    if (std::strcmp(request, "portable") == 0) wanted = Level::portable;
    else if (std::strcmp(request, "avx2") == 0) wanted = Level::avx2;
    else if (std::strcmp(request, "avx512") == 0) wanted = Level::avx512;
  }
  return wanted < supported ? wanted : supported;
}

Level chosen_level() {
  static const Level level = choose_level(std::getenv("PEFT_C_KERNELS"), supported_level());
  return level;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::portable: return "portable";
    case Level::avx2: return "avx2";
    case Level::avx512: return "avx512";
  }
  return "portable";
}

}  // namespace peft::kernels
