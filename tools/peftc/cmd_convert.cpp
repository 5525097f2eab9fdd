// peftc convert IN OUT [--dtype f32|f16|bf16] [--max-shard-size SIZE]: rewrites a safetensors file or
// checkpoint folder, converting floating-point tensors and resharding on request. Streams tensor by
// tensor through the public writer API, so memory stays small whatever the checkpoint's size.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage = "convert IN OUT [--dtype f32|f16|bf16] [--max-shard-size SIZE]";

struct Options {
  std::string in;
  std::string out;
  int32_t dtype = -1;                  // -1: keep every dtype
  std::optional<uint64_t> max_shard;  // set: OUT is a checkpoint folder split at this size
};

// Only the ordinary floating-point formats are converted; F8/F4/F6 hold quantized data with scales of
// their own, and integers, booleans and complex numbers are not floats: all of those are copied.
bool converts(int32_t dtype) {
  return dtype == PEFT_DTYPE_F64 || dtype == PEFT_DTYPE_F32 || dtype == PEFT_DTYPE_F16 ||
         dtype == PEFT_DTYPE_BF16;
}

// Copies file `file`'s metadata of the checkpoint (absent, empty or entries) to the writer.
peft_error* copy_metadata(peft_writer* writer, const peft_checkpoint* ckpt, size_t file) {
  // Clearing first drops any default (a checkpoint writer starts with {"format":"pt"}).
  if (peft_error* err = peft_writer_set_metadata_present(writer, 0)) return err;
  if (peft_error* err = peft_writer_set_metadata_present(writer, peft_checkpoint_has_metadata(ckpt, file))) return err;
  const size_t count = peft_checkpoint_metadata_count(ckpt, file);
  for (size_t e = 0; e < count; ++e) {
    peft_error* err = peft_writer_set_metadata(writer, peft_checkpoint_metadata_key(ckpt, file, e),
                                               peft_checkpoint_metadata_value(ckpt, file, e));
    if (err) return err;
  }
  return nullptr;
}

int run_convert(const Options& opts) {
  struct stat st {};
  const bool in_is_folder = ::stat(opts.in.c_str(), &st) == 0 && S_ISDIR(st.st_mode);

  Owned<peft_checkpoint, peft_checkpoint_free> ckpt;
  if (peft_error* err = peft_checkpoint_open(opts.in.c_str(), nullptr, &ckpt.p)) return report(err);

  Owned<peft_writer, peft_writer_free> writer;
  const bool to_folder = opts.max_shard || in_is_folder;
  peft_error* err = to_folder ? peft_writer_new_checkpoint(opts.out.c_str(), opts.max_shard.value_or(0), &writer.p)
                              : peft_writer_new(opts.out.c_str(), &writer.p);
  if (err) return report(err);

  // Metadata: a file keeps its own; a folder keeps its first shard's, unless resharding, where every
  // shard gets {"format":"pt"} as save_pretrained writes. The index's metadata carries over.
  if (!opts.max_shard) {
    if ((err = copy_metadata(writer.p, ckpt.p, 0))) return report(err);
  }
  if (to_folder) {
    if (const char* index_metadata = peft_checkpoint_index_metadata_json(ckpt.p)) {
      if ((err = peft_writer_set_index_metadata_json(writer.p, index_metadata))) return report(err);
    }
  }

  // Declarations in the checkpoint's order (file by file), so declaration i is source tensor i; a
  // folder rewritten without a size limit keeps its shard boundaries.
  const size_t count = peft_checkpoint_tensor_count(ckpt.p);
  for (size_t i = 0; i < count; ++i) {
    if (to_folder && !opts.max_shard && i > 0 &&
        peft_checkpoint_tensor_file(ckpt.p, i) != peft_checkpoint_tensor_file(ckpt.p, i - 1)) {
      if ((err = peft_writer_break_shard(writer.p))) return report(err);
    }
    // With its length, a name holding NUL bytes comes through whole.
    const char* name = peft_checkpoint_tensor_name(ckpt.p, i);
    const size_t name_length = peft_checkpoint_tensor_name_length(ckpt.p, i);
    const int32_t src_dtype = peft_checkpoint_tensor_dtype(ckpt.p, i);
    const int32_t dtype = opts.dtype >= 0 && converts(src_dtype) ? opts.dtype : src_dtype;
    err = peft_writer_add_tensor_n(writer.p, name, name_length, dtype,
                                 peft_checkpoint_tensor_shape(ckpt.p, i), peft_checkpoint_tensor_ndim(ckpt.p, i));
    if (err) return report(err);
  }

  if ((err = peft_writer_start(writer.p))) return report(err);
  for (size_t p = 0; p < count; ++p) {
    const size_t source = peft_writer_tensor_declaration(writer.p, p);
    // NULL: the tensor the writer expects next, which is the one declared as `source`.
    err = peft_writer_write_from_checkpoint(writer.p, nullptr, ckpt.p, source);
    if (err) return report(err);
  }
  const size_t files = peft_writer_file_count(writer.p);
  if ((err = peft_writer_finish(writer.p))) return report(err);
  std::printf("wrote %zu tensor(s) in %zu file(s) to %s\n", count, files, opts.out.c_str());
  return kExitOk;
}

int convert_command(const std::vector<std::string>& args) {
  Options opts;
  std::vector<std::string> positional;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == "--dtype") {
      const auto v = a.value();
      if (!v) return usage_error("--dtype needs a value", kUsage);
      const std::optional<int32_t> dtype = parse_float_dtype(*v);
      if (!dtype) return usage_error("--dtype must be f32, f16 or bf16, not '" + *v + "'", kUsage);
      opts.dtype = *dtype;
    } else if (arg == "--max-shard-size") {
      const auto v = a.value();
      if (!v) return usage_error("--max-shard-size needs a value", kUsage);
      opts.max_shard = parse_size(*v);
      if (!opts.max_shard) {
        return usage_error("--max-shard-size must be a positive size such as 500MB, 4.5GB, 100KB or a number of "
                           "bytes, not '" + *v + "'", kUsage);
      }
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else if (is_option(arg)) {
      return usage_error("unknown option '" + arg + "'", kUsage);
    } else {
      positional.push_back(a.raw());
    }
  }
  if (positional.size() != 2) return usage_error("convert needs IN and OUT", kUsage);
  opts.in = positional[0];
  opts.out = positional[1];
  return run_convert(opts);
}

const bool registered = register_command({"convert", kUsage, &convert_command});

}  // namespace
}  // namespace peftc
