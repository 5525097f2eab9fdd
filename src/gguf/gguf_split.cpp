#include "gguf/gguf_split.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

constexpr std::string_view kSuffix = ".gguf";

std::string type_name(GgufValueType type) {
  static constexpr const char* kNames[] = {"U8",  "I8",   "U16",    "I16",   "U32", "I32", "F32",
                                           "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
  const auto index = static_cast<uint32_t>(type);
  return index < std::size(kNames) ? kNames[index] : "type " + std::to_string(index);
}

// The value of split key `key` of one part, which must be of `type`; nullopt when the part lacks it.
std::optional<int64_t> split_key(const GgufHeader& header, std::string_view key, GgufValueType type,
                                 const std::string& part) {
  const GgufValue* value = find_metadata(header, key);
  if (value == nullptr) return std::nullopt;
  if (value->type != type)
    fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": " + std::string(key) + " is " + type_name(value->type) + ", not " +
                                          type_name(type) + " as llama.cpp reads it");
  if (type == GgufValueType::I32) return std::get<int64_t>(value->data);
  return static_cast<int64_t>(std::get<uint64_t>(value->data));
}

int64_t required_split_key(const GgufHeader& header, std::string_view key, GgufValueType type, const std::string& part) {
  const std::optional<int64_t> value = split_key(header, key, type, part);
  if (!value) fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": the part of a split model has no " + std::string(key));
  return *value;
}

bool all_digits(std::string_view text) {
  for (const char c : text)
    if (c < '0' || c > '9') return false;
  return !text.empty();
}

}  // namespace

std::string gguf_split_path(const std::string& prefix, uint32_t index, uint32_t count) {
  char tail[40];
  std::snprintf(tail, sizeof tail, "-%05u-of-%05u.gguf", index + 1, count);
  return prefix + tail;
}

std::optional<GgufSplitName> parse_gguf_split_name(const std::string& path) {
  // "<prefix>-<digits>-of-<digits>.gguf", the prefix not empty and not ending in a folder separator.
  if (path.size() < kSuffix.size() || path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return std::nullopt;
  const std::string_view stem(path.data(), path.size() - kSuffix.size());
  const size_t of = stem.rfind("-of-");
  if (of == std::string_view::npos) return std::nullopt;
  const std::string_view count_text = stem.substr(of + 4);
  if (of == 0) return std::nullopt;
  const size_t dash = stem.rfind('-', of - 1);
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  const std::string_view index_text = stem.substr(dash + 1, of - dash - 1);
  if (!all_digits(index_text) || !all_digits(count_text) || index_text.size() > 10 || count_text.size() > 10)
    return std::nullopt;
  const uint64_t number = std::stoull(std::string(index_text));
  const uint64_t count = std::stoull(std::string(count_text));
  if (number < 1 || number > count || count > 0xFFFF) return std::nullopt;
  GgufSplitName name{std::string(stem.substr(0, dash)), static_cast<uint32_t>(number - 1), static_cast<uint32_t>(count)};
  if (name.prefix.back() == '/' || gguf_split_path(name.prefix, name.index, name.count) != path) return std::nullopt;
  return name;
}

uint32_t gguf_split_count(const GgufHeader& header, const std::string& display_name) {
  return static_cast<uint32_t>(split_key(header, kGgufSplitCount, GgufValueType::U16, display_name).value_or(0));
}

std::vector<std::unique_ptr<const GgufFile>> open_gguf_model(const std::string& path, const OpenOptions& options) {
  std::unique_ptr<const GgufFile> given = GgufFile::open(path, options);
  const uint32_t count = gguf_split_count(given->header(), path);
  std::vector<std::unique_ptr<const GgufFile>> parts;
  if (count <= 1) {
    parts.push_back(std::move(given));
    return parts;
  }
  const auto given_no = static_cast<uint32_t>(required_split_key(given->header(), kGgufSplitNo, GgufValueType::U16, path));
  const std::optional<GgufSplitName> name = parse_gguf_split_name(path);
  const std::string expected = gguf_split_path("", given_no, count);
  if (!name || name->index != given_no || name->count != count)
    fail(PEFT_ERR_INVALID_CHECKPOINT, path + ": the file is part " + std::to_string(given_no + 1) + " of " +
                                          std::to_string(count) + " of a split model (split.no " +
                                          std::to_string(given_no) + ", split.count " + std::to_string(count) +
                                          "), so its name must end in " + quoted(expected) +
                                          " for its other parts to be found");
  parts.resize(count);
  for (uint32_t k = 0; k < count; ++k) {
    if (k == given_no) {
      parts[k] = std::move(given);
      continue;
    }
    const std::string part_path = gguf_split_path(name->prefix, k, count);
    struct stat st {};
    if (::stat(part_path.c_str(), &st) != 0)
      fail(PEFT_ERR_INVALID_CHECKPOINT, part_path + ": part " + std::to_string(k + 1) + " of " + std::to_string(count) +
                                            " of the split model " + quoted(path) + " is missing (" +
                                            std::strerror(errno) + ")");
    parts[k] = GgufFile::open(part_path, options);
  }
  // Every part: its number, the same count, the same tensor total; the first part says the total.
  const auto total = required_split_key(parts[0]->header(), kGgufSplitTensorsCount, GgufValueType::I32, parts[0]->path());
  uint64_t tensors = 0;
  std::unordered_map<std::string_view, uint32_t> owner;
  for (uint32_t k = 0; k < count; ++k) {
    const GgufHeader& header = parts[k]->header();
    const std::string part = parts[k]->path() + " (part " + std::to_string(k + 1) + " of " + std::to_string(count) + ")";
    const int64_t no = required_split_key(header, kGgufSplitNo, GgufValueType::U16, part);
    if (no != k)
      fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": split.no is " + std::to_string(no) + ", not " + std::to_string(k) +
                                            (no < count ? " (a duplicate of part " + std::to_string(no + 1) + "?)" : ""));
    if (const auto own = split_key(header, kGgufSplitCount, GgufValueType::U16, part); own && *own != count)
      fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": split.count is " + std::to_string(*own) + ", but " +
                                            parts[given_no]->path() + " says " + std::to_string(count));
    if (const auto own = split_key(header, kGgufSplitTensorsCount, GgufValueType::I32, part); own && *own != total)
      fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": split.tensors.count is " + std::to_string(*own) + ", but the first part says " +
                                            std::to_string(total));
    for (const TensorInfo& tensor : header.tensors) {
      const auto [it, inserted] = owner.emplace(tensor.name, k);
      if (!inserted)
        fail(PEFT_ERR_INVALID_CHECKPOINT, part + ": tensor " + quoted(tensor.name) + " is also in part " +
                                              std::to_string(it->second + 1) + " (" + parts[it->second]->path() + ")");
    }
    tensors += header.tensors.size();
  }
  if (total < 0 || tensors != static_cast<uint64_t>(total))
    fail(PEFT_ERR_INVALID_CHECKPOINT, parts[0]->path() + ": split.tensors.count is " + std::to_string(total) + ", but the " +
                                          std::to_string(count) + " parts hold " + std::to_string(tensors) + " tensors");
  return parts;
}

std::string gguf_split_output_prefix(const std::string& out_path) {
  if (const auto name = parse_gguf_split_name(out_path)) return name->prefix;
  if (out_path.size() > kSuffix.size() && out_path.ends_with(kSuffix)) return out_path.substr(0, out_path.size() - kSuffix.size());
  return out_path;
}

std::vector<GgufKeyValue> gguf_joined_metadata(const GgufHeader& first_part) {
  std::vector<GgufKeyValue> metadata;
  bool had_count = false;
  for (const GgufKeyValue& kv : first_part.metadata) {
    if (kv.key == kGgufSplitCount)
      had_count = true;
    else
      metadata.push_back(kv);
  }
  if (had_count) metadata.push_back({std::string(kGgufSplitCount), GgufValue{GgufValueType::U16, uint64_t{0}}});
  return metadata;
}

}  // namespace peft
