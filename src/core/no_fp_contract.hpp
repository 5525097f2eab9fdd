// Included first by a source file whose floating-point results must not depend on the compiler:
// turns off floating-point contraction (a * b + c fused into one FMA) for the rest of the file, so
// that every operation rounds as written and the only fused operations are explicit std::fma calls.
// The merge arithmetic matches PEFT's torch results bit for bit only this way.
#pragma once

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
