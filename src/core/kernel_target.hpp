// The compile-time facts the kernel files share: PEFT_KERNELS_X86 where the x86-64 kernels (chosen at
// run time by core/kernel_level.hpp) can be built, i.e. x86-64 with GCC or clang and their target
// attributes; PEFT_INLINE for the small helpers a kernel must inline into its own target.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PEFT_KERNELS_X86 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PEFT_INLINE [[gnu::always_inline]] inline
#else
#define PEFT_INLINE inline
#endif
