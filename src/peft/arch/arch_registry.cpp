#include "peft/arch/arch_registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

std::string library_data_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&builtin_arch_table), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
  if (ec || !lib.has_parent_path()) return {};
  return (lib.parent_path().parent_path() / "share" / "peft_c").string();
}

bool valid_family_name(const std::string& family) {
  if (family.empty() || family.size() > 64) return false;
  for (char c : family)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

struct Cache {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const ArchTable>> tables;
};
Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

std::vector<std::string> arch_table_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("PEFT_C_DATA_DIR"); env != nullptr && *env != '\0') dirs.emplace_back(env);
  if (std::string lib = library_data_dir(); !lib.empty()) dirs.push_back(lib);
#ifdef PEFT_DATA_DIR
  dirs.emplace_back(PEFT_DATA_DIR);
#endif
#ifdef PEFT_SOURCE_DATA_DIR
  dirs.emplace_back(PEFT_SOURCE_DATA_DIR);
#endif
  return dirs;
}

std::shared_ptr<const ArchTable> builtin_arch_table(const std::string& family) {
  if (!valid_family_name(family))
    fail(PEFT_ERR_INVALID_ARGUMENT, "architecture family " + peft::quoted(family) + " is not a valid name");
  {
    std::lock_guard lock(cache().mutex);
    if (auto it = cache().tables.find(family); it != cache().tables.end()) return it->second;
  }
  std::string searched;
  for (const std::string& dir : arch_table_search_dirs()) {
    fs::path path = fs::path(dir) / "arch" / (family + ".json");
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      searched += (searched.empty() ? "" : ", ") + path.string();
      continue;
    }
    auto table = ArchTable::from_file(path.string());
    std::lock_guard lock(cache().mutex);
    return cache().tables.emplace(family, table).first->second;
  }
  fail(PEFT_ERR_NOT_FOUND, "no translation table for architecture family " + peft::quoted(family) +
                               " (looked for " + searched + "; set PEFT_C_DATA_DIR to the folder holding arch/)");
}

std::shared_ptr<const ArchTable> builtin_table_for_gguf(const std::string& architecture) {
  for (const std::string& family : builtin_families()) {
    auto table = builtin_arch_table(family);
    if (table->reads_gguf_architecture(architecture)) return table;
  }
  fail(PEFT_ERR_UNSUPPORTED, "no architecture table names the tensors of GGUF architecture " + quoted(architecture) +
                                 " (docs/gguf.md lists those that do)");
}

std::shared_ptr<const ArchTable> builtin_table_for_gguf(const std::string& architecture,
                                                        const std::function<bool(const ArchTable&)>& fits) {
  for (const std::string& family : builtin_families()) {
    auto table = builtin_arch_table(family);
    if (table->reads_gguf_architecture(architecture) && fits(*table)) return table;
  }
  return builtin_table_for_gguf(architecture);
}

std::vector<std::string> builtin_families() {
  for (const std::string& dir : arch_table_search_dirs()) {
    std::error_code ec;
    fs::path arch = fs::path(dir) / "arch";
    if (!fs::is_directory(arch, ec)) continue;
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(arch, ec))
      if (entry.path().extension() == ".json" && valid_family_name(entry.path().stem().string()))
        names.push_back(entry.path().stem().string());
    if (names.empty()) continue;
    std::sort(names.begin(), names.end());
    return names;
  }
  return {};
}

std::optional<FamilyGuess> detect_family(const nlohmann::json* base_config,
                                         const std::optional<std::string>& base_model_name_or_path) {
  std::vector<std::shared_ptr<const ArchTable>> tables;
  for (const std::string& family : builtin_families()) tables.push_back(builtin_arch_table(family));

  if (base_config && base_config->is_object()) {
    if (auto it = base_config->find("model_type"); it != base_config->end() && it->is_string()) {
      std::string model_type = it->get<std::string>();
      for (const auto& table : tables)
        for (const std::string& t : table->model_types())
          if (t == model_type) return FamilyGuess{table->family(), "model_type " + peft::quoted(model_type) + " in config.json"};
    }
    if (auto it = base_config->find("architectures"); it != base_config->end() && it->is_array()) {
      for (const auto& arch : *it) {
        if (!arch.is_string()) continue;
        for (const auto& table : tables)
          for (const std::string& a : table->architectures())
            if (a == arch.get<std::string>())
              return FamilyGuess{table->family(), "architecture " + peft::quoted(a) + " in config.json"};
      }
    }
  }
  if (base_model_name_or_path) {
    std::string name = *base_model_name_or_path;
    while (!name.empty() && name.back() == '/') name.pop_back();
    if (size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
    std::optional<FamilyGuess> best;
    size_t best_length = 0;
    for (const auto& table : tables) {
      for (const std::string& pattern : table->name_patterns()) {
        PythonRegex regex("(?i)" + pattern, PEFT_ERR_INVALID_CONFIG,
                          "name pattern of translation table " + table->source());
        auto m = regex.search_groups(name);
        if (!m || !m->groups[0]) continue;
        size_t length = m->groups[0]->size();
        if (!best || length > best_length) {
          best = FamilyGuess{table->family(), "name " + peft::quoted(name) + " matches " + peft::quoted(pattern) +
                                                  " of the " + table->family() + " table"};
          best_length = length;
        }
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

}  // namespace peft
