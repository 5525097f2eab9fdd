// The doctor's --fix (doctor_fix.hpp): the fixed copy of the adapter folder.
#include "peft/doctor/doctor_fix.hpp"

#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/text.hpp"
#include "peft/export/adapter_export.hpp"
#include "checkpoint/hub_cache.hpp"
#include "safetensors/writer.hpp"

namespace peft::doctor {

namespace fs = std::filesystem;

// --fix never writes over what it reads: the adapter folder, the base folder (by file identity,
// core/file_identity), or any folder of a hub cache snapshot (its files are links into blobs/; the
// path compared weakly canonical, links resolved, the folder may not exist yet).
void check_out_dir(const DoctorState& d, const std::string& out_dir) {
  refuse_output_over_inputs(out_dir, {{"the adapter folder", d.dir},
                                      {"the base model folder", d.base ? d.base->dir : std::string()}});
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(out_dir, ec), ec);
  for (fs::path p = out; !p.empty() && p != p.root_path(); p = p.parent_path())
    if (auto repository = hub_repository_of_snapshot(p.string()))
      fail(PEFT_ERR_INVALID_ARGUMENT, "the fixed copy's folder " + peft::quoted(out_dir) +
                                          " is inside a hub cache snapshot of " + peft::quoted(*repository) +
                                          " (its files are links into the cache); give another folder");
}

void write_fix(const DoctorState& d, const std::string& out_dir) {
  std::vector<OutputTensor> tensors;
  std::set<std::string> written;
  for (const Entry& e : d.entries) {
    if (e.final_key.empty()) continue;
    if (!written.insert(e.final_key).second)  // check_duplicates keeps keys apart
      fail(PEFT_ERR_INTERNAL, "the fix would write key " + peft::quoted(e.final_key) + " twice");
    const TensorInfo& info = d.weights->tensor(e.index);
    OutputTensor out;
    out.key = e.final_key;
    out.dtype = info.dtype;
    out.shape = info.shape;
    const Checkpoint& checkpoint = *d.weights;
    const size_t index = e.index;
    out.write = [&checkpoint, index](TensorWriter& writer, const std::string& key) {
      writer.write_from_checkpoint(key, checkpoint, index);
    };
    tensors.push_back(std::move(out));
  }
  nlohmann::ordered_json config = d.config.document;
  for (const auto& [field, key, value] : d.config_changes) {
    if (!config.contains(field) || !config[field].is_object()) config[field] = nlohmann::ordered_json::object();
    if (field == "rank_pattern")
      config[field][key] = static_cast<int64_t>(value);
    else
      config[field][key] = value;
  }
  for (const char* field : {"target_modules", "modules_to_save"}) {
    if (!config.contains(field) || !config[field].is_array()) continue;
    for (auto& item : config[field])
      if (item.is_string())
        if (auto it = d.module_renamed.find(item.get<std::string>()); it != d.module_renamed.end()) item = it->second;
  }
  write_adapter_folder(out_dir, config, tensors, std::nullopt);
}

}  // namespace peft::doctor
