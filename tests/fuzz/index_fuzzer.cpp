// libFuzzer target over the shard index reader (model.safetensors.index.json): parse_shard_index on
// the input as index text. Every failure must be a peft::Error with PEFT_ERR_INVALID_CHECKPOINT;
// every accepted index must hold a non-empty weight_map of plain relative shard names, its shard list
// sorted and distinct, each named by some entry, and metadata that parses back as a JSON object.
// Anything else (a crash, a sanitizer report, another exception, a timeout) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "checkpoint/checkpoint_layout.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

bool plain_relative(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string_view part(name.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  peft::ShardIndex index;
  try {
    index = peft::parse_shard_index(text, "fuzz.index.json");
  } catch (const peft::Error& e) {
    require(e.code() == PEFT_ERR_INVALID_CHECKPOINT);
    return 0;
  }
  require(!index.weight_map.empty() && !index.shards.empty());
  require(std::is_sorted(index.shards.begin(), index.shards.end()));
  require(std::adjacent_find(index.shards.begin(), index.shards.end()) == index.shards.end());
  for (const auto& [tensor, shard] : index.weight_map) {
    require(plain_relative(shard));
    require(std::binary_search(index.shards.begin(), index.shards.end(), shard));
  }
  if (index.metadata_json) require(peft::parse_json(*index.metadata_json, 1, "metadata").is_object());
  return 0;
}
