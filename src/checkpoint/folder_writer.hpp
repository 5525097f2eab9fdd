// How a write replaces a checkpoint folder (what the folder holds, its names and its index, is
// checkpoint_layout.hpp's): the shard writer of the C API (ShardedWriter) and the merged-checkpoint
// writer (MergedFolderWriter) differ only in how they plan their files.
//
// Readers disagree when a folder holds both entry points: peftc opens model.safetensors.index.json
// first, transformers opens model.safetensors first. So a write never lets both name different
// models, and the index (or the single file) is renamed last, as the one commit point:
//
//  * Sharded output: every shard is written under a name no reader can reach yet, its planned name
//    when that is free (no such file, not listed by the current index, not model.safetensors) or
//    else the planned name with a per-write token before ".safetensors"
//    ("model-00001-of-00002.peft-Ab3dE9xZ.safetensors"). The shards are renamed into the folder
//    (unreferenced), a model.safetensors of an older layout is moved aside, and the index is
//    renamed over the old one: the commit point.
//  * Single-file output: an index of an older layout is moved aside, then model.safetensors is
//    renamed over the old one: the commit point.
//  * Then the other files (config.json, ...) are renamed into place, and everything of the older
//    layout is removed: the files moved aside, model.safetensors, the index, numbered and
//    tokenized shard names, and the shards the old index listed.
//
// A failure before the commit point removes the new files and moves back what was moved aside. A
// process killed at any step leaves the old model or the new one, the same for both readers, except
// between moving the other entry point aside and the commit (only when the layout changes between
// single-file and sharded), where the folder holds no loadable model. Temporaries of killed runs
// (".<name>.peft-tmp-XXXXXX") are removed when the next write into the folder starts; the orphan
// shards of a killed run are removed when the next write commits.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "safetensors/writer.hpp"

namespace peft {

// A file of the folder besides its weights, copied from `source_path` or written from `content`.
struct FolderFile {
  std::string name;                    // file name in the output folder
  std::string source_path;             // copied from here when `content` is unset
  std::optional<std::string> content;  // otherwise written with this text
};

// One weight file as planned (its name relative to the folder, before any token is added).
struct PlannedWeightFile {
  std::string name;
  std::vector<size_t> members;  // declaration indices
  WriterMetadata metadata;
};

struct FolderLayout {
  std::vector<PlannedWeightFile> files;  // at least one
  bool write_index = false;
  std::string index_metadata_json = "{}";  // a JSON object; "total_size" is recomputed
};

class CheckpointFolderWriter : public TensorWriter {
 public:
  // The weight files' names as written (tokens included), valid after start().
  const std::vector<std::string>& weight_names() const { return names_; }
  // Every path written into the folder, relative to it (weights, index, other files), after start().
  std::vector<std::string> written_names() const;

 protected:
  CheckpointFolderWriter(std::string folder, WriterMetadata initial_metadata, std::vector<FolderFile> other_files);

  virtual FolderLayout plan_layout(const std::vector<TensorDecl>& decls) = 0;
  const std::string& folder() const { return folder_; }

 private:
  std::vector<OutputSpec> plan_outputs(const std::vector<TensorDecl>& decls) final;
  void prepare_outputs() final;  // creates the folder, removes temporaries of killed runs
  void commit_outputs() final;
  std::unique_ptr<AtomicFile> make_index_file();
  void remove_old_layout() noexcept;

  std::string folder_;
  std::vector<FolderFile> other_files_;
  std::vector<std::string> names_;
  bool write_index_ = false;
  std::string index_metadata_json_;
  std::set<std::string> old_index_shards_;  // the shards the folder's index listed before the write
};

// Copies a file into an AtomicFile (not committed), in bounded chunks. PEFT_ERR_IO naming the file.
void copy_into(const std::string& source_path, AtomicFile& target);

}  // namespace peft
