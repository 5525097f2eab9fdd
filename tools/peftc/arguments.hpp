// What peftc's subcommands share when they read their command line: walking the arguments (with
// "--name=value" and "--name value" as the same option), the value parsers (numbers, sizes as
// huggingface_hub writes them, float dtypes) and a scope guard for C API handles.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace peftc {

// The arguments of a command, one at a time:
//   for (Arguments a(args); a.next();) { if (a.name() == "--out") out = a.value(); ... }
class Arguments {
 public:
  explicit Arguments(const std::vector<std::string>& args) : args_(args) {}

  // Moves to the next argument; false when there is none.
  bool next();
  // The argument, without its "=value" part when it is an option ("--dtype=bf16" gives "--dtype").
  const std::string& name() const { return name_; }
  // The argument exactly as given.
  const std::string& raw() const { return args_[index_]; }
  // Whether the argument had an "=value" part.
  bool has_inline_value() const { return inline_value_.has_value(); }
  // The option's value: its "=value" part, or else the next argument (which is then consumed).
  std::optional<std::string> value();

 private:
  const std::vector<std::string>& args_;
  size_t index_ = 0;
  bool started_ = false;
  std::string name_;
  std::optional<std::string> inline_value_;
};

// Whether an argument looks like an option ("--x"), as opposed to a positional argument.
bool is_option(const std::string& argument);

// A finite decimal number (all of the text, no overflow), or nothing.
std::optional<double> parse_number(const std::string& text);

// huggingface_hub's parse_size_to_int: a number (float allowed) and a decimal unit TB/GB/MB/KB,
// case-insensitive, truncated to an integer; plain digits are bytes. Nothing for zero or junk.
std::optional<uint64_t> parse_size(const std::string& text);

// PEFT_DTYPE_F32, _F16 or _BF16 for "f32"/"F32"/"float32" and the like, or nothing.
std::optional<int32_t> parse_float_dtype(const std::string& name);

// Frees a C API handle when the scope ends.
template <class T, void (*Free)(T*)>
struct Owned {
  T* p = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Free(p); }
};

}  // namespace peftc
