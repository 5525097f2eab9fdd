// libFuzzer target over the adapter config reader (adapter_config.json): LoraConfig::parse on the
// input. Every failure must be a peft::Error with PEFT_ERR_INVALID_CONFIG or PEFT_ERR_UNSUPPORTED;
// every accepted config must have a positive rank and a finite alpha, and its canonical form (what an
// export writes) must parse back to the same typed values. Anything else (a crash, a sanitizer report,
// another exception, a timeout) is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "peft/adapter/adapter_config.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

bool is_config_code(int32_t code) { return code == PEFT_ERR_INVALID_CONFIG || code == PEFT_ERR_UNSUPPORTED; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const peft::LoraConfig config = peft::LoraConfig::parse(text, "fuzz/adapter_config.json");
    require(config.r > 0 && std::isfinite(config.lora_alpha));
    const peft::LoraConfig again = peft::LoraConfig::parse(config.canonical_json(), "fuzz/canonical");
    require(again.r == config.r && again.lora_alpha == config.lora_alpha && again.bias == config.bias);
  } catch (const peft::Error& e) {
    require(is_config_code(e.code()));
  }
  return 0;
}
