#include "core/dtype.hpp"

#include <array>

namespace peft {
namespace {

struct DTypeInfo {
  std::string_view name;
  uint32_t bits;
};

// Indexed by the DType value, i.e. in the reference's declaration order.
constexpr std::array<DTypeInfo, kDTypeCount> kInfo = {{
    {"BOOL", 8},  {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},    {"F8_E5M2", 8},      {"F8_E4M3", 8},      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},   {"U16", 16},         {"F16", 16},    {"BF16", 16},
    {"I32", 32},  {"U32", 32},         {"F32", 32},         {"C64", 64},    {"F64", 64},
    {"I64", 64},  {"U64", 64},
}};

// The first 8 bytes of a name as a little-endian integer, zero past its end (so "F32" and "F32\0"
// differ only in their lengths, which are compared too).
constexpr uint64_t packed_name(std::string_view name) {
  uint64_t key = 0;
  for (size_t k = 0; k < name.size() && k < 8; ++k) key |= uint64_t(static_cast<unsigned char>(name[k])) << (8 * k);
  return key;
}

// packed_name of each dtype name; 0 for the names longer than 8 bytes, which never match.
constexpr std::array<uint64_t, kDTypeCount> kPackedNames = [] {
  std::array<uint64_t, kDTypeCount> keys{};
  for (size_t i = 0; i < kInfo.size(); ++i) keys[i] = kInfo[i].name.size() <= 8 ? packed_name(kInfo[i].name) : 0;
  return keys;
}();

}  // namespace

std::string_view dtype_name(DType dtype) { return kInfo[static_cast<size_t>(dtype)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  // Runs for every tensor of a header. Names of up to 8 bytes are compared as one integer and a
  // length each (a byte loop per candidate was 6% of opening a 10,000-tensor header, this 3%); the
  // two of 11 bytes as strings.
  if (name.empty() || name.size() > 8) {
    for (size_t i = 0; i < kInfo.size(); ++i) {
      if (kInfo[i].name == name) return static_cast<DType>(i);
    }
    return std::nullopt;
  }
  const uint64_t key = packed_name(name);
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kPackedNames[i] == key && kInfo[i].name.size() == name.size()) return static_cast<DType>(i);
  }
  return std::nullopt;
}

uint32_t dtype_bits(DType dtype) { return kInfo[static_cast<size_t>(dtype)].bits; }

}  // namespace peft
