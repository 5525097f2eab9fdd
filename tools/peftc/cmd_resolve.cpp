// peftc resolve ID_OR_PATH: prints the folder a model id stands for in the local Hugging Face hub
// cache (org/name, org/name@revision), or the path itself when it exists. Offline: nothing is
// downloaded. Every command that takes a folder takes such an id too; this one shows where it leads.
#include <cstdio>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage = "resolve ID_OR_PATH";

int resolve_command(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == "-h" || arg == "--help") {
      char* cache = nullptr;
      if (peft_error* err = peft_hub_cache_dir(&cache)) return report(err);
      std::printf("usage: peftc %s\n\nID_OR_PATH is a path, or a model id (name, org/name, org/name@revision with a "
                  "branch, tag or commit hash) looked up offline in the hub cache %s\n", kUsage, cache);
      peft_string_free(cache);
      return kExitOk;
    }
    if (is_option(arg)) return usage_error("unknown option '" + arg + "'", kUsage);
    positional.push_back(a.raw());
  }
  if (positional.size() != 1) return usage_error("resolve needs one ID_OR_PATH", kUsage);
  char* folder = nullptr;
  if (peft_error* err = peft_hub_resolve(positional[0].c_str(), &folder)) return report(err);
  std::printf("%s\n", folder);
  peft_string_free(folder);
  return kExitOk;
}

const bool registered = register_command({"resolve", kUsage, &resolve_command});

}  // namespace
}  // namespace peftc
