#include "peft/merge/merged_folder_writer.hpp"

#include "core/error.hpp"

namespace peft {

MergedFolderWriter::MergedFolderWriter(std::string folder, std::vector<OutputFilePlan> files, bool write_index,
                                       std::string index_metadata_json, std::vector<FolderFile> extra_files)
    : CheckpointFolderWriter(std::move(folder), std::nullopt, std::move(extra_files)) {
  if (files.empty()) fail(PEFT_ERR_INTERNAL, "a merged checkpoint needs at least one file");
  layout_.files = std::move(files);
  layout_.write_index = write_index;
  layout_.index_metadata_json = std::move(index_metadata_json);
}

namespace {

std::vector<OutputFilePlan> planned_files(const MergePlan& plan) {
  std::vector<OutputFilePlan> files;
  for (const PlannedFile& f : plan.files) files.push_back({f.name, f.members, f.metadata});
  return files;
}

}  // namespace

MergedFolderWriter::MergedFolderWriter(std::string folder, const MergePlan& plan, std::vector<FolderFile> extra_files)
    : MergedFolderWriter(std::move(folder), planned_files(plan), plan.write_index, plan.index_metadata_json,
                         std::move(extra_files)) {
  for (const PlannedTensor& p : plan.tensors) add_tensor(p.name, p.out_dtype, p.shape);
}

FolderLayout MergedFolderWriter::plan_layout(const std::vector<TensorDecl>&) { return layout_; }

}  // namespace peft
