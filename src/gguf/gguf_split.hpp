// Split GGUF models: llama.cpp's `llama-gguf-split` cuts one model into files named
// `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, ... (the part number 1-based, both
// numbers at least five digits), and this is how large GGUF models are published. The one place
// that knows the names and the keys: every part holds `split.no` (U16, the 0-based part number),
// `split.count` (U16, the number of parts) and `split.tensors.count` (I32, the tensors of all parts
// together); the first part also holds the model's metadata (the other parts hold only the split
// keys when llama-gguf-split writes them). Each part is a complete GGUF file with its own tensors.
//
// llama.cpp (src/llama-model-loader.cpp) reads the keys with exactly these types, takes the model's
// metadata from the first part only, and treats a file without `split.count`, or with 0 (what
// `llama-gguf-split --merge` leaves in a joined file), as a whole model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "gguf/gguf_header.hpp"

namespace peft {

inline constexpr std::string_view kGgufSplitNo = "split.no";                      // U16, 0-based
inline constexpr std::string_view kGgufSplitCount = "split.count";                // U16
inline constexpr std::string_view kGgufSplitTensorsCount = "split.tensors.count"; // I32

// A part's file name taken apart: `prefix` (the path before "-00001-of-00003.gguf"), the 0-based
// part number and the number of parts.
struct GgufSplitName {
  std::string prefix;
  uint32_t index = 0;
  uint32_t count = 0;
};

// The name of part `index` (0-based) of `count` parts: "<prefix>-%05d-of-%05d.gguf" as llama.cpp's
// llama_split_path writes it.
std::string gguf_split_path(const std::string& prefix, uint32_t index, uint32_t count);

// `path` taken apart when its file name ends in "-NNNNN-of-MMMMM.gguf" as gguf_split_path writes it
// (1 <= NNNNN <= MMMMM <= 65535, written back identically); nullopt otherwise.
std::optional<GgufSplitName> parse_gguf_split_name(const std::string& path);

// The number of parts a header says its model has: `split.count`, or 0 without it (a whole model).
// PEFT_ERR_INVALID_CHECKPOINT naming `display_name` when the key is not a U16.
uint32_t gguf_split_count(const GgufHeader& header, const std::string& display_name);

// Opens the model that the GGUF file `path` belongs to: the file alone when its split.count is 0
// or 1 (or absent), else every part, found next to it by name, in part order (whichever part
// `path` is). Each part is opened and validated as GgufFile::open does; then the parts together,
// each refusal PEFT_ERR_INVALID_CHECKPOINT naming the part and the reason: a name that does not
// match the file's split.no and split.count, a missing part, a split key missing or of another type
// than llama.cpp reads, a part whose split.no, split.count or split.tensors.count differs from what
// its name and the first part say, a tensor in two parts, a tensor total other than
// split.tensors.count.
std::vector<std::unique_ptr<const GgufFile>> open_gguf_model(const std::string& path, const OpenOptions& options = {});

// Where a merge of a split model writes its parts: the prefix of `out_path` when it is itself a
// part's name (any part of any count), else `out_path` without ".gguf".
std::string gguf_split_output_prefix(const std::string& out_path);

// The metadata of a model joined into one file from its first part's metadata, as
// `llama-gguf-split --merge` writes it: the same entries in the same order, except that
// split.count is removed and appended last with the value 0 (so that no reader takes the file for a
// part). A header without split.count is returned unchanged.
std::vector<GgufKeyValue> gguf_joined_metadata(const GgufHeader& first_part);

}  // namespace peft
