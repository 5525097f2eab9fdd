#include "checkpoint/hub_cache.hpp"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cctype>
#include <cstdlib>
#include <system_error>
#include <vector>

#include "core/error.hpp"
#include "core/path.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxRepoPart = 96;
constexpr size_t kMinShortHash = 4;
constexpr size_t kCommitHashSize = 40;
constexpr uint64_t kMaxRefBytes = 4096;

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The home folder of user `name` (the current user when null) from the password database, with the
// reentrant calls (the hub functions are thread-safe).
std::optional<std::string> home_of(const char* name) {
  const long suggested = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(suggested > 0 ? static_cast<size_t>(suggested) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  const int rc = name ? ::getpwnam_r(name, &entry, buffer.data(), buffer.size(), &found)
                      : ::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found);
  if (rc != 0 || found == nullptr || entry.pw_dir == nullptr) return std::nullopt;
  return std::string(entry.pw_dir);
}

// Python's posixpath.expanduser.
std::string expand_user(const std::string& path) {
  if (path.empty() || path[0] != '~') return path;
  size_t end = path.find('/', 1);
  if (end == std::string::npos) end = path.size();
  std::string home;
  if (end == 1) {
    if (auto value = std::getenv("HOME")) {
      home = value;
    } else if (auto found = home_of(nullptr)) {
      home = *found;
    } else {
      return path;
    }
  } else {
    auto found = home_of(path.substr(1, end - 1).c_str());
    if (!found) return path;
    home = *found;
  }
  while (!home.empty() && home.back() == '/') home.pop_back();
  const std::string result = home + path.substr(end);
  return result.empty() ? "/" : result;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// Python's posixpath.expandvars: $NAME and ${NAME} of variables that are set; others stay as written.
std::string expand_vars(const std::string& path) {
  std::string out;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] != '$') {
      out += path[i++];
      continue;
    }
    size_t name_begin = i + 1, name_end = name_begin, next = name_begin;
    if (name_begin < path.size() && path[name_begin] == '{') {
      const size_t close = path.find('}', name_begin + 1);
      if (close == std::string::npos) {
        out += path[i++];
        continue;
      }
      name_begin += 1;
      name_end = close;
      next = close + 1;
    } else {
      while (name_end < path.size() && is_word_char(path[name_end])) ++name_end;
      if (name_end == name_begin) {
        out += path[i++];
        continue;
      }
      next = name_end;
    }
    const char* value = std::getenv(path.substr(name_begin, name_end - name_begin).c_str());
    if (value == nullptr) {
      out.append(path, i, next - i);
    } else {
      out += value;
    }
    i = next;
  }
  return out;
}

std::string expand(const std::string& path) { return expand_vars(expand_user(path)); }

bool is_lower_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// One part of a repo id, as huggingface_hub's REPO_ID_REGEX takes it.
std::optional<std::string> repo_part_problem(std::string_view part) {
  if (part.empty()) return "an empty part";
  if (part.size() > kMaxRepoPart) return "a part longer than 96 characters";
  for (char c : part)
    if (!is_word_char(c) && c != '-' && c != '.')
      return "the character " + peft::quoted(std::string(1, c)) + " (only ASCII letters, digits, '_', '-' and '.' are allowed)";
  if (!is_word_char(part.front()) || !is_word_char(part.back())) return "a part starting or ending with '-' or '.'";
  return std::nullopt;
}

std::string repo_folder_name(const std::string& repo) {
  std::string name = "models--" + repo;
  const size_t slash = name.find('/');
  if (slash != std::string::npos) name.replace(slash, 1, "--");
  return name;
}

std::string offline_note(const std::string& repo) {
  return "; peft_c looks models up in the local cache only and downloads nothing (download it first, e.g. `hf "
         "download " + repo + "`)";
}

// The names under refs/ ("main", "v1", "refs/pr/1"), sorted, for messages.
std::string known_refs(const fs::path& refs) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(refs, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) names.push_back(fs::relative(it->path(), refs, ec).generic_string());
  std::sort(names.begin(), names.end());
  if (names.empty()) return "refs/ names no branch or tag";
  std::string text = "refs/ names ";
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + peft::quoted(names[i]);
  return text;
}

}  // namespace

std::string hub_cache_dir() {
  if (auto value = env("HF_HUB_CACHE")) return expand(*value);
  if (auto value = env("HUGGINGFACE_HUB_CACHE")) return expand(*value);
  std::string home;
  if (auto value = env("HF_HOME")) {
    home = *value;
  } else {
    const std::string cache = env("XDG_CACHE_HOME").value_or(join_path(expand_user("~"), ".cache"));
    home = join_path(cache, "huggingface");
  }
  return expand(join_path(expand(home), "hub"));
}

std::optional<HubModelId> parse_hub_model_id(std::string_view text, std::string* why_not) {
  auto no = [&](const std::string& why) -> std::optional<HubModelId> {
    if (why_not) *why_not = why;
    return std::nullopt;
  };
  if (text.empty()) return no("it is empty");
  if (text.find('\0') != std::string_view::npos) return no("it contains a NUL byte");
  const size_t at = text.find('@');
  const std::string_view repo = text.substr(0, at);
  if (repo.starts_with('/')) return no("it is an absolute path");
  if (std::count(repo.begin(), repo.end(), '/') > 1) return no("a model id is \"name\" or \"org/name\", with one '/' at most");
  std::vector<std::string_view> parts{repo};
  if (const size_t slash = repo.find('/'); slash != std::string_view::npos) parts = {repo.substr(0, slash), repo.substr(slash + 1)};
  for (std::string_view part : parts)
    if (auto problem = repo_part_problem(part)) return no("it has " + *problem);
  if (repo.find("--") != std::string_view::npos || repo.find("..") != std::string_view::npos)
    return no("a model id cannot contain \"--\" or \"..\"");
  if (repo.ends_with(".git")) return no("a model id cannot end in \".git\"");
  HubModelId id{std::string(repo), "main"};
  if (at != std::string_view::npos) {
    const std::string_view revision = text.substr(at + 1);
    if (revision.empty()) return no("the revision after '@' is empty");
    if (revision.starts_with('/')) return no("the revision is an absolute path");
    size_t start = 0;
    while (start <= revision.size()) {
      size_t end = revision.find('/', start);
      if (end == std::string_view::npos) end = revision.size();
      const std::string_view part = revision.substr(start, end - start);
      if (part.empty() || part == "." || part == "..")
        return no("the revision " + peft::quoted(std::string(revision)) + " has an empty, \".\" or \"..\" component");
      start = end + 1;
    }
    id.revision = std::string(revision);
  }
  return id;
}

std::string resolve_hub_model_id(const std::string& text) {
  std::string why;
  const std::optional<HubModelId> id = parse_hub_model_id(text, &why);
  if (!id) fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(text) + " is not a model id: " + why);
  const std::string cache = hub_cache_dir();
  const std::string where = "the Hugging Face hub cache " + peft::quoted(cache);
  const std::string repo_dir = join_path(cache, repo_folder_name(id->repo));
  const std::string what = "model " + peft::quoted(id->repo);
  std::error_code ec;
  if (!fs::is_directory(repo_dir, ec))
    fail(PEFT_ERR_NOT_FOUND, what + " is not in " + where + " (no folder " + repo_folder_name(id->repo) + " there)" +
                                 offline_note(id->repo));

  const std::string& revision = id->revision;
  const std::string snapshots = join_path(repo_dir, "snapshots");
  const std::string ref = join_path(join_path(repo_dir, "refs"), revision);
  std::string commit, how;
  if (revision.size() == kCommitHashSize && is_lower_hex(revision)) {
    commit = revision;
    how = "commit " + revision;
  } else if (fs::is_regular_file(ref, ec)) {
    // huggingface_hub writes the 40-digit hash alone; anything else (too long, other bytes) is no ref.
    std::string content;
    try {
      content = read_text_file(ref, kMaxRefBytes);
    } catch (const Error& error) {
      if (error.code() != PEFT_ERR_INVALID_ARGUMENT) throw;  // IO stays IO; too long is no hash
    }
    while (!content.empty() && std::isspace(static_cast<unsigned char>(content.back()))) content.pop_back();
    if (content.size() != kCommitHashSize || !is_lower_hex(content))
      fail(PEFT_ERR_NOT_FOUND, what + ": " + ref + " holds no commit hash (40 lowercase hex digits)" +
                                   offline_note(id->repo));
    commit = content;
    how = "refs/" + revision + " -> " + commit;
  } else {
    std::vector<std::string> matches;
    if (revision.size() >= kMinShortHash && revision.size() < kCommitHashSize && is_lower_hex(revision)) {
      for (fs::directory_iterator it(snapshots, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.starts_with(revision) && it->is_directory(ec)) matches.push_back(name);
      }
      std::sort(matches.begin(), matches.end());
    }
    if (matches.size() > 1) {
      std::string list;
      for (size_t i = 0; i < matches.size(); ++i) list += (i ? ", " : "") + matches[i];
      fail(PEFT_ERR_NOT_FOUND, what + ": revision " + peft::quoted(revision) + " is ambiguous in " + where + ": it starts " +
                                   std::to_string(matches.size()) + " snapshots (" + list + "); give more of the hash");
    }
    if (matches.empty())
      fail(PEFT_ERR_NOT_FOUND, what + ": revision " + peft::quoted(revision) + " is not in " + where + " (no refs/" + revision +
                                   " and no snapshot whose commit starts with it; " +
                                   known_refs(join_path(repo_dir, "refs")) + ")" + offline_note(id->repo));
    commit = matches.front();
    how = "commit " + commit;
  }
  const std::string snapshot = join_path(snapshots, commit);
  if (!fs::is_directory(snapshot, ec))
    fail(PEFT_ERR_NOT_FOUND, what + ": revision " + peft::quoted(revision) + " (" + how + ") has no snapshot folder " + snapshot +
                                 " in " + where + offline_note(id->repo));
  return snapshot;
}

std::string resolve_path_or_hub_id(const std::string& path_or_id) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path_or_id, ec))) return path_or_id;
  std::string why;
  if (!parse_hub_model_id(path_or_id, &why))
    fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(path_or_id) + " is neither an existing path nor a model id (" + why + ")");
  return resolve_hub_model_id(path_or_id);
}

std::string resolve_model_location(const std::string& path_or_id, std::initializer_list<const char*> files) {
  std::error_code ec;
  std::string location = path_or_id;
  if (!fs::exists(fs::symlink_status(path_or_id, ec))) {
    const std::optional<HubModelId> id = parse_hub_model_id(path_or_id, nullptr);
    // A missing folder or file (a name ending in .safetensors is a file): the caller says so.
    if (!id || id->repo.find('/') == std::string::npos || id->repo.ends_with(".safetensors")) return path_or_id;
    try {
      location = resolve_hub_model_id(path_or_id);
    } catch (const Error& error) {
      fail(error.code(), "no file or folder " + peft::quoted(path_or_id) + " exists, and as a model id: " + error.what());
    }
  }
  for (const char* name : files) check_downloaded(location, name, "the file");
  return location;
}

std::optional<std::string> hub_repository_of_snapshot(const std::string& real_folder) {
  // The folder itself or a subfolder of a snapshot (models keep weights in subfolders too).
  for (fs::path at(real_folder); at.has_relative_path(); at = at.parent_path()) {
    const fs::path snapshots = at.parent_path();
    const fs::path repository = snapshots.parent_path();
    if (snapshots.filename() == "snapshots" && repository.filename().native().starts_with("models--"))
      return repository.native();
  }
  return std::nullopt;
}

void fail_missing_from_snapshot(const std::string& folder, const std::string& repository_folder,
                                const std::string& name, const std::string& what) {
  const fs::path repository(repository_folder);
  const std::string shown = join_path(folder, name);
  std::error_code ec;
  std::string detail;
  if (fs::is_symlink(shown, ec)) {
    const fs::path target = fs::read_symlink(shown, ec);
    detail = " links to " + target.native() + ", which does not exist";
    const fs::path blob = (fs::path(shown).parent_path() / target).lexically_normal();
    const fs::path partial = blob.native() + ".incomplete";
    if (fs::exists(partial, ec)) detail += " (" + partial.native() + " is a partial download)";
  } else {
    detail = " is missing from the snapshot";
    std::vector<std::string> partials;
    for (fs::directory_iterator it(repository / "blobs", ec), end; !ec && it != end; it.increment(ec))
      if (it->path().native().ends_with(".incomplete")) partials.push_back(it->path().filename().native());
    std::sort(partials.begin(), partials.end());
    if (!partials.empty())
      detail += " (" + std::to_string(partials.size()) + " partial download(s) in " + (repository / "blobs").native() +
                ": " + partials.front() + (partials.size() > 1 ? ", ..." : "") + ")";
  }
  // models--org--name -> org/name
  std::string repo = repository.filename().native().substr(8);
  const size_t separator = repo.find("--");
  if (separator != std::string::npos) repo.replace(separator, 2, "/");
  fail(PEFT_ERR_NOT_FOUND, shown + ": " + what + detail + ": the download of " + peft::quoted(repo) +
                               " into the Hugging Face hub cache is incomplete" + offline_note(repo));
}

void check_downloaded(const std::string& folder, const std::string& name, const std::string& what) {
  const fs::path path = fs::path(folder) / name;
  std::error_code ec;
  if (!fs::is_symlink(path, ec) || fs::exists(path, ec)) return;
  const fs::path real_folder = fs::canonical(folder, ec);
  if (ec) return;
  if (auto repository = hub_repository_of_snapshot(real_folder.native()))
    fail_missing_from_snapshot(folder, *repository, name, what);
}

}  // namespace peft
