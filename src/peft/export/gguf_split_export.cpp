#include "peft/export/gguf_split_export.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/path.hpp"
#include "core/text.hpp"
#include "gguf/gguf_file.hpp"
#include "peft/merge/merge_entry.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

// Whether two paths name the same file or folder (lexically, or as existing entries).
bool same_location(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec) && !ec) return true;
  ec.clear();
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec) && !ec;
}

// Removes what a merge wrote to `base_out` (never throws): the file, or the folder's files and the
// folder itself when the merge created it.
void remove_merged(const std::string& base_out, bool gguf, bool folder_existed,
                   const CheckpointMergeResult& result) noexcept {
  if (gguf) {
    remove_file(base_out);
    return;
  }
  for (const std::string& name : result.files) remove_file(join_path(base_out, name));
  std::error_code ec;
  if (!folder_existed) fs::remove(base_out, ec);  // only when empty
}

}  // namespace

void export_gguf_adapter_split(const std::shared_ptr<const Adapter>& adapter, const std::string& out_path,
                               const GgufAdapterExportOptions& options, const std::string& base_out,
                               unsigned threads) {
  if (!adapter) fail(PEFT_ERR_INVALID_ARGUMENT, "no adapter given");
  if (out_path.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the GGUF adapter's path is empty");
  if (base_out.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the merged base's path (--split-into) is empty");
  const std::string base_name = gguf_export_base_name(*adapter, options);
  const bool gguf_base = is_gguf_path(base_name);
  const std::string base_location = gguf_base ? base_name : resolve_model_location(base_name);
  if (same_location(base_out, base_location))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the merged base " + peft::quoted(base_out) + " is the base " +
                                        peft::quoted(base_location) + " itself");
  if (same_location(base_out, out_path))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the merged base " + peft::quoted(base_out) + " and the GGUF adapter " +
                                        peft::quoted(out_path) + " are the same path");

  GgufAdapterExportOptions adapter_options = options;
  adapter_options.base = base_name;
  // What the GGUF LoRA cannot hold goes to the merge (on a tied base, an embedding change on one side
  // only: the merge unties the copy of the base).
  adapter_options.skip.clear();
  adapter_options.skip = gguf_lora_unsupported_modules(*adapter, adapter_options);

  const std::string staged = atomic_temp_name_for(out_path);
  export_gguf_adapter(*adapter, staged, adapter_options);
  std::error_code ec;
  const bool folder_existed = fs::exists(base_out, ec);
  CheckpointMergeResult result;
  try {
    CheckpointMergeOptions merge;
    MergeInput input(adapter, 1.0);
    input.modules = adapter_options.skip;
    merge.adapters.push_back(std::move(input));
    merge.threads = threads;
    result = merge_into_base(base_location, base_out, merge);
  } catch (...) {
    remove_file(staged);
    throw;
  }
  if (const int err = rename_file(staged, out_path); err != 0) {
    remove_file(staged);
    remove_merged(base_out, gguf_base, folder_existed, result);
    fail(PEFT_ERR_IO, "cannot rename " + peft::quoted(staged) + " to " + peft::quoted(out_path) + ": " +
                          std::strerror(err) + " (the merged base " + peft::quoted(base_out) + " was removed again)");
  }
  sync_directory(parent_folder(out_path));
}

}  // namespace peft
