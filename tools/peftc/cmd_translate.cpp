// peftc translate [--arch FAMILY | --table FILE] [--reverse [--peft-prefix]] KEY...
// Translates tensor keys between HuggingFace names and native names, one result per line, in order.
// Without --arch or --table, the first built-in table (by name) that resolves every key is used.
#include <cstdio>
#include <string>
#include <vector>

#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "translate [--arch FAMILY | --table FILE] [--reverse [--peft-prefix]] KEY...   (or: translate --list)";

// Runs the batch translation; on success prints one key per line.
peft_error* translate(const peft_translator* tr, const std::vector<std::string>& keys, bool reverse,
                      bool peft_prefix, bool print) {
  std::vector<const char*> input;
  for (const std::string& k : keys) input.push_back(k.c_str());
  std::vector<char*> output(keys.size(), nullptr);
  peft_error* err = reverse ? peft_translator_to_hf_batch(tr, input.data(), input.size(), peft_prefix, output.data())
                            : peft_translator_to_native_batch(tr, input.data(), input.size(), output.data());
  if (err) return err;
  for (char* s : output) {
    if (print) std::printf("%s\n", s);
    peft_string_free(s);
  }
  return nullptr;
}

int list_families() {
  char* list = nullptr;
  if (peft_error* err = peft_translator_builtin_families(&list)) return report(err);
  std::fputs(list, stdout);
  peft_string_free(list);
  return kExitOk;
}

int run_translate(const std::vector<std::string>& args) {
  std::string arch, table;
  bool reverse = false, peft_prefix = false;
  std::vector<std::string> keys;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--list") return list_families();
    if (arg == "--arch" || arg == "--table") {
      if (i + 1 >= args.size()) return usage_error(arg + " needs a value", kUsage);
      (arg == "--arch" ? arch : table) = args[++i];
    } else if (arg == "--reverse") {
      reverse = true;
    } else if (arg == "--peft-prefix") {
      peft_prefix = true;
    } else if (arg == "--") {
      keys.insert(keys.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    } else if (!arg.empty() && arg[0] == '-') {
      return usage_error("unknown option " + arg, kUsage);
    } else {
      keys.push_back(arg);
    }
  }
  if (!arch.empty() && !table.empty()) return usage_error("give --arch or --table, not both", kUsage);
  if (peft_prefix && !reverse) return usage_error("--peft-prefix applies to --reverse only", kUsage);
  if (keys.empty()) return usage_error("no KEY given", kUsage);

  if (!arch.empty() || !table.empty()) {
    peft_translator* tr = nullptr;
    peft_error* err = !arch.empty() ? peft_translator_new_builtin(arch.c_str(), &tr)
                                    : peft_translator_from_file(table.c_str(), &tr);
    if (err) return report(err);
    err = translate(tr, keys, reverse, peft_prefix, true);
    peft_translator_free(tr);
    return err ? report(err) : kExitOk;
  }

  // No table given: the first built-in table that resolves every key.
  char* list = nullptr;
  if (peft_error* err = peft_translator_builtin_families(&list)) return report(err);
  std::string families = list;
  peft_string_free(list);
  size_t start = 0;
  while (start < families.size()) {
    size_t end = families.find('\n', start);
    std::string family = families.substr(start, end - start);
    start = end + 1;
    peft_translator* tr = nullptr;
    if (peft_error* err = peft_translator_new_builtin(family.c_str(), &tr)) return report(err);
    peft_error* err = translate(tr, keys, reverse, peft_prefix, false);
    if (!err) {
      translate(tr, keys, reverse, peft_prefix, true);
      peft_translator_free(tr);
      return kExitOk;
    }
    peft_error_free(err);
    peft_translator_free(tr);
  }
  std::fprintf(stderr,
               "peftc: error: UNRESOLVED_KEY: no built-in translation table resolves every key; name one with "
               "--arch (see translate --list) or give your own with --table\n");
  return kExitFailure;
}

const bool registered = register_command({"translate", kUsage, run_translate});

}  // namespace
}  // namespace peftc
