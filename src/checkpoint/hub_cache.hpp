// The Hugging Face hub cache as huggingface_hub lays it out, the one statement of it in the library:
// where the cache is (huggingface_hub's constants.py: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME,
// XDG_CACHE_HOME, ~/.cache), a model repository's folder (<cache>/models--org--name), its refs/
// (branch or tag -> commit) and snapshots/<commit>/ whose files link to ../../blobs/<hash>, and what
// an interrupted download leaves (blobs/<hash>.incomplete, a snapshot file missing or linking to a
// missing blob). Model ids are resolved in the cache alone: nothing here touches the network.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace peft {

// The cache folder huggingface_hub uses, from the environment as its constants.py computes it:
// HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub; "~" and "$VAR" expanded as Python's os.path.expanduser/expandvars
// do. A variable set to the empty string counts as unset. The folder need not exist.
std::string hub_cache_dir();

// A model id: "name" or "org/name" (huggingface_hub's validate_repo_id: ASCII letters, digits, '_',
// '-', '.', each part 1 to 96 characters starting and ending with a letter, digit or '_', no "--"
// or "..", not ending in ".git"), optionally followed by "@revision" (a branch, a tag, "refs/pr/N",
// a full commit hash or a short prefix of one).
struct HubModelId {
  std::string repo;      // "org/name"
  std::string revision;  // "main" when none was given
};

// `text` as a model id; nullopt, with the reason in *why_not, when it is not one.
std::optional<HubModelId> parse_hub_model_id(std::string_view text, std::string* why_not);

// The snapshot folder <cache>/models--org--name/snapshots/<commit> of a model id, offline: the
// revision is a full commit hash (that snapshot), else a name under refs/ (the commit it holds),
// else a prefix of at least 4 hex digits matching exactly one snapshot. PEFT_ERR_INVALID_ARGUMENT
// when `id` is not a model id; PEFT_ERR_NOT_FOUND when the repository, the revision or its snapshot
// is not in the cache or a short hash is ambiguous, saying what was looked for, where, and that
// nothing is downloaded.
std::string resolve_hub_model_id(const std::string& id);

// For a caller that names a folder or an id explicitly (peft_hub_resolve): `path_or_id` itself when
// it exists, else resolve_hub_model_id (INVALID_ARGUMENT says it is neither a path nor an id).
std::string resolve_path_or_hub_id(const std::string& path_or_id);

// The one function every place that takes a base model or adapter folder calls first: `path_or_id`
// itself when it exists or cannot be an id with a namespace ("org/name" or "org/name@revision";
// not a name ending in ".safetensors", which is a file), so that a missing plain folder or file
// keeps its caller's error; else that id's snapshot folder
// (resolve_hub_model_id's errors). When the folder is a hub snapshot, each of `files` that links
// to a missing blob is PEFT_ERR_NOT_FOUND (check_downloaded).
std::string resolve_model_location(const std::string& path_or_id, std::initializer_list<const char*> files = {});

// The repository folder <cache>/models--org--name when `real_folder` (a real path, links resolved)
// is one of its snapshots (<repository>/snapshots/<commit>) or a folder inside one; nullopt otherwise.
std::optional<std::string> hub_repository_of_snapshot(const std::string& real_folder);

// File `name` (described as `what`) of `folder`, a hub snapshot, is missing or links to a missing
// blob: PEFT_ERR_NOT_FOUND naming it, saying the download is incomplete (with the partial blob,
// blobs/<hash>.incomplete, when there is one) and that nothing is downloaded.
[[noreturn]] void fail_missing_from_snapshot(const std::string& folder, const std::string& repository,
                                             const std::string& name, const std::string& what);

// When `folder` is a hub snapshot and its file `name` is a link to a blob that is missing:
// fail_missing_from_snapshot. Nothing otherwise (a plain folder, a present or absent file).
void check_downloaded(const std::string& folder, const std::string& name, const std::string& what);

}  // namespace peft
