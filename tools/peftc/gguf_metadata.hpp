// GGUF metadata as peftc prints it: JSON (every value, typed) and text (long arrays abridged).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

#include "peft_c.h"

namespace peftc {

// Both print to `out` one entry at a time, so that a header of millions of entries is never held
// twice (docs/gguf.md, "Memory").
// {"key": {"type": "u32", "value": 7}, "tokens": {"type": "array", "element_type": "string",
// "value": [...]}, ...} in file order. Non-finite floats are the strings "nan", "inf", "-inf".
void print_gguf_metadata_json(const peft_checkpoint* ckpt, size_t file, std::FILE* out);

// One line per entry, "  key (type) = value", arrays cut after `max_elements` elements.
void print_gguf_metadata_text(const peft_checkpoint* ckpt, size_t file, size_t max_elements, std::FILE* out);

// The ggml type's name ("Q4_K"), or "ggml type N" for one peftc does not know.
std::string ggml_type_text(int32_t ggml_type);

}  // namespace peftc
