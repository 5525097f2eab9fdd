// GGUF files built in memory for the parser's tests, and the parser run over a byte string through
// a reader that refuses any read leaving the string.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_header.hpp"

namespace gguf_test {

inline std::string u32(uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}
inline std::string u64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}
inline std::string str(const std::string& s) { return u64(s.size()) + s; }

// Bytes of a tensor of `type` with ggml dimensions `ne` (0 for an unknown type).
inline uint64_t tensor_bytes(const std::vector<uint64_t>& ne, uint32_t type) {
  const auto t = peft::ggml_type(type);
  if (!t) return 0;
  uint64_t elements = 1;
  for (uint64_t d : ne) elements *= d;
  return elements / t->block_size * t->type_size;
}

// A GGUF file: prefix, key-value pairs, tensor infos, padding, data. Counts, offsets and the data
// follow from what was added unless overridden, so that one field at a time can be broken.
// build() pads the header to `alignment` when that is small (up to 1 MiB).
struct Builder {
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint64_t alignment = 32;  // for automatic offsets and padding (add general.alignment yourself)
  std::optional<uint64_t> kv_count, tensor_count;
  std::string kvs, infos;
  uint64_t n_kv = 0, n_tensors = 0, data_size = 0;

  Builder& kv(const std::string& key, uint32_t type, const std::string& payload) {
    kvs += str(key) + u32(type) + payload;
    ++n_kv;
    return *this;
  }
  Builder& kv_u32(const std::string& key, uint32_t v) { return kv(key, 4, u32(v)); }
  Builder& kv_string(const std::string& key, const std::string& v) { return kv(key, 8, str(v)); }
  Builder& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                  std::optional<uint64_t> offset = std::nullopt) {
    infos += str(name) + u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) infos += u64(d);
    infos += u32(type) + u64(offset.value_or(data_size));
    const uint64_t bytes = tensor_bytes(ne, type);
    data_size += (bytes + alignment - 1) / alignment * alignment;
    ++n_tensors;
    return *this;
  }
  std::string header() const {
    return magic + u32(version) + u64(tensor_count.value_or(n_tensors)) + u64(kv_count.value_or(n_kv)) + kvs + infos;
  }
  std::string build() const {
    std::string out = header();
    if (alignment <= (1u << 20)) out.append((alignment - out.size() % alignment) % alignment, '\0');
    // The data (at most 1 MiB of it: files of overflowing tensors stop there).
    for (uint64_t i = 0; i < data_size && i < (1u << 20); ++i) out += static_cast<char>(i * 7 + 1);
    return out;
  }
};

inline peft::GgufHeader parse(const std::string& file, uint64_t max_header = 100'000'000,
                              uint64_t* largest_read = nullptr) {
  const peft::GgufByteReader reader = [&](uint64_t offset, void* dst, uint64_t count) {
    if (offset > file.size() || count > file.size() - offset) {
      throw peft::Error(PEFT_ERR_INTERNAL, "the parser read past the end of the file");
    }
    if (largest_read && count > *largest_read) *largest_read = count;
    std::memcpy(dst, file.data() + offset, count);
  };
  return peft::parse_gguf_header(reader, file.size(), max_header, "test.gguf");
}

// "OK" or the code name; the message in `message` when given.
inline std::string outcome(const std::string& file, uint64_t max_header = 100'000'000, std::string* message = nullptr) {
  try {
    parse(file, max_header);
    return "OK";
  } catch (const peft::Error& e) {
    if (message) *message = e.what();
    return peft::code_name(e.code());
  }
}

}  // namespace gguf_test
