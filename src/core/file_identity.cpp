#include "core/file_identity.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "core/path.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

struct Identity {
  uint64_t device = 0, inode = 0;
  bool operator==(const Identity&) const = default;
};

// A path's identity with links followed, and whether it is a folder; nullopt when it does not exist.
std::optional<std::pair<Identity, bool>> identity_of(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::pair{Identity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}, S_ISDIR(st.st_mode)};
}

// The path itself and, for a folder, the regular files directly inside it.
std::vector<std::pair<Identity, std::string>> identities(const std::string& path) {
  std::vector<std::pair<Identity, std::string>> out;
  const auto self = identity_of(path);
  if (!self) return out;
  out.emplace_back(self->first, path);
  if (!self->second) return out;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    const std::string member = join_path(path, name);
    if (const auto id = identity_of(member); id && !id->second) out.emplace_back(id->first, member);
  }
  ::closedir(dir);
  return out;
}

}  // namespace

void refuse_output_over_inputs(const std::string& out, const std::vector<JobInput>& inputs) {
  const auto written = identities(out);
  if (written.empty()) return;
  for (const JobInput& input : inputs)
    for (const auto& [id, read_path] : identities(input.path))
      for (const auto& [out_id, out_path] : written) {
        if (id != out_id) continue;
        if (read_path == input.path && out_path == out)
          fail(PEFT_ERR_INVALID_ARGUMENT, "the output " + quoted(out) + " is " + input.role + " itself (" +
                                              quoted(input.path) + "); write to another path");
        fail(PEFT_ERR_INVALID_ARGUMENT,
             "the output " + quoted(out) + " would replace " + quoted(read_path) +
                 (read_path == input.path ? std::string() : ", in " + input.role + " " + quoted(input.path)) +
                 (out_path == out ? std::string() : " (as " + quoted(out_path) + ")") + "; write to another path");
      }
}

}  // namespace peft
