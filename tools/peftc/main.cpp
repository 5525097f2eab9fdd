#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "command.hpp"

namespace peftc {

static std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

bool register_command(const Command& command) {
  commands().push_back(command);
  return true;
}

int report(peft_error* err) {
  std::fprintf(stderr, "peftc: error: %s: %s\n", peft_error_code_name(peft_error_code(err)),
               peft_error_message(err));
  peft_error_free(err);
  return kExitFailure;
}

int usage_error(const std::string& message, const char* usage) {
  std::fprintf(stderr, "peftc: error: %s\nusage: peftc %s\n", message.c_str(), usage);
  return kExitUsage;
}

static void print_usage(FILE* out) {
  std::fprintf(out, "peftc %s: HuggingFace PEFT adapters and safetensors checkpoints\n\nusage:\n",
               peft_version());
  for (const Command& c : commands()) std::fprintf(out, "  peftc %s\n", c.usage);
}

}  // namespace peftc

int main(int argc, char** argv) {
  using namespace peftc;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(stderr);
    return kExitUsage;
  }
  if (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    print_usage(stdout);
    return kExitOk;
  }
  if (args[0] == "--version") {
    std::printf("peftc %s (kernels: %s)\n", peft_version(), peft_kernels());
    return kExitOk;
  }
  // A two-word command ("adapter inspect") wins over a one-word one.
  for (size_t words = 2; words >= 1; --words) {
    if (args.size() < words) continue;
    std::string name = args[0];
    for (size_t i = 1; i < words; ++i) name += " " + args[i];
    for (const Command& c : commands()) {
      if (name == c.name) return c.run(std::vector<std::string>(args.begin() + words, args.end()));
    }
  }
  std::fprintf(stderr, "peftc: error: unknown command '%s'\n", args[0].c_str());
  print_usage(stderr);
  return kExitUsage;
}
