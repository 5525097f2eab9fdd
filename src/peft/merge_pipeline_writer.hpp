// The writer of a merged checkpoint folder: the planned files under the planned names (the base's
// shard names, or save_pretrained's when resharding), each with its own metadata, the index, and
// the folder's other files (config.json and the rest), all committed together at the end.
//
// Everything is written to temporaries first and flushed; only then are the weight files renamed
// into place, then the index and the other files. After that, files of an older layout in the
// output folder (model.safetensors, model-XXXXX-of-XXXXX.safetensors, the shards an older index
// listed, a stale index) are removed. A failure before the renames leaves the folder as it was.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "peft/merge_pipeline_config.hpp"
#include "safetensors/writer.hpp"

namespace peft {

struct OutputFilePlan {
  std::string name;             // relative to the folder
  std::vector<size_t> members;  // declaration indices
  WriterMetadata metadata;
};

class MergedFolderWriter final : public TensorWriter {
 public:
  // `index_metadata_json` is a JSON object (its total_size is recomputed); used when `write_index`.
  MergedFolderWriter(std::string folder, std::vector<OutputFilePlan> files, bool write_index,
                     std::string index_metadata_json, std::vector<FolderFile> extra_files);

  // Every path written into the folder, relative to it, once finished (weights, index, other files).
  std::vector<std::string> written_names() const;

 protected:
  std::vector<OutputSpec> plan_outputs(const std::vector<TensorDecl>& decls) override;
  std::vector<std::unique_ptr<AtomicFile>> make_extra_files() override;
  void after_commit() noexcept override;

 private:
  std::string folder_;
  std::vector<OutputFilePlan> files_;
  bool write_index_;
  std::string index_metadata_json_;
  std::vector<FolderFile> extra_files_;
  std::set<std::string> stale_candidates_;  // model files found in the folder before writing
};

// Copies a file into an AtomicFile (not committed), in bounded chunks. PEFT_ERR_IO naming the file.
void copy_into(const std::string& source_path, AtomicFile& target);

}  // namespace peft
