// peftc's subcommands register themselves here, one source file each, so that main.cpp never
// changes when a command is added. The tool uses the public C API alone.
#pragma once

#include <string>
#include <vector>

#include "peft_c.h"

namespace peftc {

// Exit statuses: 0 success, 1 bad input or failed operation, 2 usage error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;   // "inspect", or "adapter inspect" for a two-word command
  const char* usage;  // one line, without the leading "peftc "
  CommandFn run;      // receives the arguments after the command's name
};

// Registers a command; call from a static initializer: `static const bool r = register_command({...});`
bool register_command(const Command& command);

// Prints "peftc: error: CODE_NAME: message" to stderr, frees the error and returns kExitFailure.
int report(peft_error* err);

// Prints "peftc: error: message" and the command's usage to stderr; returns kExitUsage.
int usage_error(const std::string& message, const char* usage);

}  // namespace peftc
