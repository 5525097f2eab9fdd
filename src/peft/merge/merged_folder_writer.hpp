// The writer of a merged checkpoint folder: the planned files under the planned names (the base's
// shard names, or save_pretrained's when resharding), each with its own metadata, the index, and
// the folder's other files (config.json and the rest). How the folder is replaced (names, commit
// order, cleaning an older layout) is CheckpointFolderWriter's (checkpoint/folder_writer.hpp).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/folder_writer.hpp"
#include "peft/merge/merge_plan.hpp"

namespace peft {

using OutputFilePlan = PlannedWeightFile;

class MergedFolderWriter final : public CheckpointFolderWriter {
 public:
  // `index_metadata_json` is a JSON object (its total_size is recomputed); used when `write_index`.
  MergedFolderWriter(std::string folder, std::vector<OutputFilePlan> files, bool write_index,
                     std::string index_metadata_json, std::vector<FolderFile> extra_files);
  // The folder `plan` lays out (its files, index and every planned tensor declared), with `extra_files`.
  MergedFolderWriter(std::string folder, const MergePlan& plan, std::vector<FolderFile> extra_files);

 protected:
  FolderLayout plan_layout(const std::vector<TensorDecl>& decls) override;

 private:
  FolderLayout layout_;
};

}  // namespace peft
