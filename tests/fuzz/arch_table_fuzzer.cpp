// libFuzzer target over the translation table reader (data/arch/*.json, --table files,
// peft_translator_from_json): ArchTable::parse on the input. Every failure must be a peft::Error with
// PEFT_ERR_INVALID_CONFIG. Anything else (a crash, a sanitizer report, another exception, a timeout)
// is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.hpp"
#include "peft/arch/arch_table.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    require(peft::ArchTable::parse(text, "fuzz-table") != nullptr);
  } catch (const peft::Error& e) {
    require(e.code() == PEFT_ERR_INVALID_CONFIG);
  }
  return 0;
}
