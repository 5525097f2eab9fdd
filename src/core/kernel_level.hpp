// Which instruction-set level the kernel tables run at (core/convert_kernels.hpp for dtype
// conversions, peft/kernels/merge_kernels.hpp for the merge arithmetic). One choice for the whole process,
// made on first use: the highest level this CPU and operating system support, or a lower one named
// by the environment variable PEFT_C_KERNELS ("portable", "avx2", "avx512"; "auto", unset or any
// other value: the highest). A level the CPU lacks is never chosen: asking for it gives the highest
// level below it. peft_kernels() in the public header reports the choice.
#pragma once

#include "core/kernel_target.hpp"  // PEFT_KERNELS_X86, read by the getters' macro below

namespace peft::kernels {

enum class Level { portable = 0, avx2 = 1, avx512 = 2 };

// avx2: AVX2, FMA and F16C with the YMM state saved by the OS. avx512: that and AVX-512 F, BW, VL,
// DQ with the ZMM and mask state saved. Always portable on other architectures.
Level supported_level();

// The level every table uses, fixed at the first call.
Level chosen_level();

// "portable", "avx2", "avx512".
const char* level_name(Level level);

// The level PEFT_C_KERNELS names as text, or supported() for "auto" and anything unknown; then
// lowered to what the CPU supports. Exposed for the tests; chosen_level() applies it once.
Level choose_level(const char* request, Level supported);

// `table` when this CPU supports `level`, else nullptr (the x86 tables' getters).
template <class Table>
const Table* if_supported(Level level, const Table* table) {
  return supported_level() >= level ? table : nullptr;
}

// The table of the level in use among a kernel family's tables (avx2 and avx512 may be nullptr:
// not this CPU, or not x86-64). Each family keeps the result in its own active().
template <class Table>
const Table& chosen_table(const Table& portable, const Table* avx2, const Table* avx512) {
  const Level level = chosen_level();
  if (avx512 != nullptr && level >= Level::avx512) return *avx512;
  if (avx2 != nullptr && level >= Level::avx2) return *avx2;
  return portable;
}

}  // namespace peft::kernels

// Defines a kernel family's getters in the enclosing namespace, over its tables: portable(),
// x86_avx2() and x86_avx512() (nullptr where the CPU lacks the level, or off x86-64, where the
// two x86 tables are not compiled and their names are not read) and active() (chosen_table, once).
#ifdef PEFT_KERNELS_X86
#define PEFT_KERNEL_X86_GETTERS(Table, avx2_table, avx512_table)                                                     \
  const Table* x86_avx2() { return ::peft::kernels::if_supported(::peft::kernels::Level::avx2, &(avx2_table)); }     \
  const Table* x86_avx512() { return ::peft::kernels::if_supported(::peft::kernels::Level::avx512, &(avx512_table)); }
#else
#define PEFT_KERNEL_X86_GETTERS(Table, avx2_table, avx512_table) \
  const Table* x86_avx2() { return nullptr; }                    \
  const Table* x86_avx512() { return nullptr; }
#endif
#define PEFT_KERNEL_TABLE_GETTERS(Table, portable_table, avx2_table, avx512_table)                   \
  const Table& portable() { return portable_table; }                                                  \
  PEFT_KERNEL_X86_GETTERS(Table, avx2_table, avx512_table)                                            \
  const Table& active() {                                                                             \
    static const Table& chosen = ::peft::kernels::chosen_table(portable(), x86_avx2(), x86_avx512()); \
    return chosen;                                                                                    \
  }
