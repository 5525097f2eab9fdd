// libFuzzer target over the GGUF LoRA adapter reader (peft/adapter/gguf_lora_file.hpp) and the checks
// a GGUF merge makes of its pairs (peft/merge/gguf_lora_input.hpp). Per input, as the bytes are and
// again with the first 8 bytes forced to "GGUF" version 3 (as gguf_header_fuzzer does):
//  1. Checkpoint::open_memory, then open_gguf_lora: general.type, adapter.type, general.architecture,
//     adapter.lora.alpha (a float, finite) and the pairing of "<target>.lora_a" / ".lora_b" names;
//  2. every factor: gguf_lora_factor_readable and read_gguf_lora_factor (F32/F16/BF16/Q8_0 as f32);
//  3. gguf_lora_terms with the file as its own base (its tensors that are not factors stand for the
//     base tensors; they are dropped from the adapter's list so that the terms are built): the factor
//     shape and type checks, and the factors of each term read and sliced.
// Every failure must be a peft::Error with a code these readers document, with a one-line message
// for the metadata checks; an accepted file must satisfy the invariants below. Anything else (a crash,
// a sanitizer report, another exception escaping, a large allocation) is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "peft/adapter/gguf_lora_file.hpp"
#include "peft/merge/gguf_lora_input.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

// The codes of opening a GGUF file (the header codes, IO never: the input is in memory) and of the
// LoRA checks.
bool expected_code(int32_t code) {
  return (code >= PEFT_ERR_HEADER_TOO_SMALL && code <= PEFT_ERR_METADATA_INCOMPLETE_BUFFER) ||
         code == PEFT_ERR_UNSUPPORTED || code == PEFT_ERR_INVALID_ARGUMENT || code == PEFT_ERR_INVALID_CHECKPOINT ||
         code == PEFT_ERR_UNRESOLVED_KEY || code == PEFT_ERR_SHAPE_MISMATCH;
}

uint64_t elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // the header reader has checked that the byte size fits
  return n;
}

void check_lora(const peft::GgufLoraFile& lora) {
  require(std::isfinite(lora.alpha));
  const peft::Checkpoint& file = *lora.file;
  size_t factors = 0;
  for (size_t k = 0; k < lora.pairs.size(); ++k) {
    const peft::GgufLoraPair& pair = lora.pairs[k];
    require(k == 0 || lora.pairs[k - 1].target < pair.target);  // sorted, distinct
    require(pair.a || pair.b);
    if (pair.a) require(file.tensor(*pair.a).name == pair.target + ".lora_a"), ++factors;
    if (pair.b) require(file.tensor(*pair.b).name == pair.target + ".lora_b"), ++factors;
  }
  require(factors + lora.others.size() == file.tensor_count());

  // Every factor read alone.
  for (size_t i = 0; i < file.tensor_count(); ++i) {
    const peft::TensorInfo& info = file.tensor(i);
    try {
      const std::vector<float> values = peft::read_gguf_lora_factor(file, i);
      require(peft::gguf_lora_factor_readable(info));
      require(values.size() == elements(info.shape));
    } catch (const peft::Error& e) {
      require(!peft::gguf_lora_factor_readable(info) && e.code() == PEFT_ERR_UNSUPPORTED);
    }
  }

  // The merge's checks, the file standing for its own base.
  peft::GgufLoraFile alone = lora;
  alone.others.clear();
  try {
    const std::vector<peft::GgufLoraTerm> terms = peft::gguf_lora_terms(alone, 0.5, file, lora.architecture);
    for (const peft::GgufLoraTerm& term : terms) {
      require(term.tensor < file.tensor_count());
      require(term.module.rank > 0 && term.module.lora_a != nullptr && term.module.lora_b != nullptr);
      require(std::isfinite(term.module.scaling));
    }
  } catch (const peft::Error& e) {
    require(expected_code(e.code()));
  }
}

void run(const uint8_t* data, size_t size) {
  std::shared_ptr<const peft::Checkpoint> file;
  try {
    file = peft::Checkpoint::open_memory(data, size);
  } catch (const peft::Error& e) {
    require(expected_code(e.code()));
    return;
  }
  try {
    check_lora(*peft::open_gguf_lora(file, "fuzz.gguf"));
  } catch (const peft::Error& e) {
    require(expected_code(e.code()));
    require(std::string_view(e.what()).find('\n') == std::string_view::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size);
  if (size >= 8 && std::memcmp(data, "GGUF\x03\x00\x00\x00", 8) != 0) {
    std::vector<uint8_t> forced(data, data + size);
    std::memcpy(forced.data(), "GGUF\x03\x00\x00\x00", 8);
    run(forced.data(), forced.size());
  }
  return 0;
}
