// libFuzzer target over the GGUF header reader (parse_gguf_header). Per input it parses
//  1. the bytes as a whole file;
//  2. the same with a header cap of half the input, to reach the HEADER_TOO_LARGE paths;
//  3. a copy whose first 8 bytes are forced to "GGUF" version 3, so that mutations of the magic or
//     version do not hide the rest of the header from the fuzzer.
// The reader traps on any read outside the input. Every accepted header must satisfy the format's
// invariants (below); every failure must be a peft::Error with one of the header codes. Anything
// else (a crash, a sanitizer report, another exception escaping, a large allocation) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_header.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

bool is_header_code(int32_t code) {
  return (code >= PEFT_ERR_HEADER_TOO_SMALL && code <= PEFT_ERR_METADATA_INCOMPLETE_BUFFER &&
          code != PEFT_ERR_MISALIGNED_SLICE) ||
         code == PEFT_ERR_UNSUPPORTED;
}

void check_accepted(const peft::GgufHeader& h, uint64_t size, uint64_t max_header) {
  require(h.version == 2 || h.version == 3);
  require(h.alignment != 0 && (h.alignment & (h.alignment - 1)) == 0);
  require(h.data_start <= size && h.data_start <= max_header);
  std::unordered_set<std::string> keys;
  for (const peft::GgufKeyValue& kv : h.metadata) {
    require(!kv.key.empty() && peft::is_valid_utf8(kv.key) && keys.insert(kv.key).second);
    if (kv.value.type == peft::GgufValueType::ARRAY) {
      const auto& array = std::get<peft::GgufArray>(kv.value.data);
      require(array.element_type != peft::GgufValueType::ARRAY);
      require(array.well_formed());
      for (size_t k = 0; k < array.size(); ++k) require(array.at(k).type == array.element_type);
    }
  }
  if (!h.tensors.empty()) require(h.data_start % h.alignment == 0);
  std::unordered_set<std::string> names;
  uint64_t expected = 0;
  for (const peft::TensorInfo& t : h.tensors) {
    require(t.name.size() < 64 && peft::is_valid_utf8(t.name) && names.insert(t.name).second);
    require(t.shape.size() <= 4 && t.begin == expected && t.end >= t.begin);
    const auto type = peft::ggml_type(static_cast<uint32_t>(t.ggml_type));
    require(type.has_value());
    unsigned __int128 elements = 1;
    for (uint64_t d : t.shape) elements *= d;  // at most 4 dimensions of < 2^63: no overflow
    const uint64_t row = t.shape.empty() ? 1 : t.shape.back();
    require(row % type->block_size == 0);
    require(elements / type->block_size * type->type_size == t.nbytes());
    require(t.block_quantized == !peft::dtype_of_ggml(type->id).has_value());
    require(h.data_start + t.end <= size);
    expected = t.begin + (t.nbytes() + h.alignment - 1) / h.alignment * h.alignment;
  }
  require(expected == h.data_size);
}

void run(const uint8_t* data, size_t size, uint64_t max_header) {
  const peft::GgufByteReader reader = [&](uint64_t offset, void* dst, uint64_t count) {
    require(offset <= size && count <= size - offset && count <= 64 * 1024);
    std::memcpy(dst, data + offset, count);
  };
  try {
    check_accepted(peft::parse_gguf_header(reader, size, max_header, "fuzz.gguf"), size, max_header);
  } catch (const peft::Error& e) {
    require(is_header_code(e.code()));
    require(std::string_view(e.what()).find('\n') == std::string_view::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size, 100'000'000);
  run(data, size, size / 2);
  if (size >= 8) {
    std::vector<uint8_t> forced(data, data + size);
    std::memcpy(forced.data(), "GGUF\x03\x00\x00\x00", 8);
    run(forced.data(), forced.size(), 100'000'000);
  }
  return 0;
}
