#include "peft/merge/merge_entry.hpp"

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/quant/ggml_types.hpp"
#include "core/text.hpp"
#include "gguf/gguf_file.hpp"
#include "peft/merge/gguf_merge.hpp"

namespace peft {

CheckpointMergeResult merge_into_base(const std::string& base, const std::string& out,
                                      const CheckpointMergeOptions& options) {
  if (is_gguf_path(base)) {
    if (options.combine && options.combine->how != merge::TaskArithmetic::linear)
      fail(PEFT_ERR_UNSUPPORTED, "adapters combined on their deltas (ties, dare_*, magnitude_prune) are merged into "
                                 "checkpoint bases only, not into the GGUF base " + quoted(base) +
                                 "; combine them first (peftc adapter combine --deltas) and merge the result");
    return merge_into_gguf(base, out, options);
  }
  return merge_checkpoint(base, out, options);  // which resolves a hub model id
}

CheckpointMergeResult merge_adapters(const std::string& base, const std::string& out,
                                     const std::vector<MergeAdapter>& adapters, CheckpointMergeOptions options) {
  // A GGUF base is a file whose names are GGUF's: adapters are checked against it by the merge
  // (open_merge_inputs opens folders without it, and GGUF LoRA files for it alone).
  options.adapters = open_merge_inputs(adapters, base);
  return merge_into_base(base, out, options);
}

std::string store_report_json(const std::vector<GgufStoreReport>& report) {
  auto type_name = [](uint32_t id) {
    const auto type = ggml_type(id);
    return type ? std::string(type->name) : std::to_string(id);
  };
  nlohmann::json out = nlohmann::json::array();
  for (const GgufStoreReport& t : report)
    out.push_back({{"tensor", t.tensor}, {"base_type", type_name(t.base_type)}, {"type", type_name(t.out_type)},
                   {"values", t.values}, {"rms", t.rms}, {"max", t.max}, {"base_rms", t.base_rms},
                   {"base_max", t.base_max}});
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace peft
