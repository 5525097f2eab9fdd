// Opening an adapter folder the way every peftc command that reads adapters does: against a base
// model when one is given, strictly or, with --lenient, as PEFT loads it, printing what lenient
// loading ignored to stderr ("warning: <text>", one per line).
#pragma once

#include <string>

#include "peft_c.h"

namespace peftc {

// The option every command that opens an adapter accepts.
inline constexpr const char* kLenientOption = "--lenient";

// Opens `dir` (against `base` unless it is empty). Returns the error of the C API, or NULL.
peft_error* open_adapter(const std::string& dir, const std::string& base, bool lenient, peft_adapter** out);

// Whether `path` is a file starting with GGUF's magic: a GGUF LoRA adapter or model file where a
// command also takes folders.
bool is_gguf_file(const std::string& path);

// Prints the adapter's warnings (peft_adapter_warning) to stderr, each as "warning: <text>".
void print_warnings(const peft_adapter* adapter);

}  // namespace peftc
