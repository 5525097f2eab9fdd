// TensorWriter::write_from_checkpoint: kept apart so that the writer core does not depend on the
// reading side.
#include <algorithm>

#include "core/error.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "checkpoint/checkpoint.hpp"
#include "safetensors/writer.hpp"

namespace peft {

void TensorWriter::write_from_checkpoint(std::string_view name, const Checkpoint& source, size_t index) {
  require_streaming("write a tensor");
  start();
  const TensorInfo& info = source.tensor(index);  // INVALID_ARGUMENT when out of range
  if (info.block_quantized) {
    const auto type = ggml_type(static_cast<uint32_t>(info.ggml_type));
    fail(PEFT_ERR_UNSUPPORTED, "tensor " + quoted(info.name) + " is block-quantized (" +
                                   std::string(type ? type->name : "unknown ggml type") +
                                   "): a safetensors file cannot hold it");
  }
  if (is_next(name)) {
    const TensorDecl& decl = tensor_at(next_position());
    if (!std::equal(decl.shape.begin(), decl.shape.end(), info.shape.begin(), info.shape.end())) {
      fail(PEFT_ERR_SHAPE_MISMATCH, "tensor " + quoted(decl.name) + ": the source tensor " + quoted(info.name) +
                                        " has a different shape");
    }
    bytes_from(decl, info.dtype);  // UNSUPPORTED before anything is written
  }
  // Read in chunks with pread, never through a mapping, so a source truncated meanwhile gives
  // PEFT_ERR_IO rather than SIGBUS. A source that changed before this call is reported before the
  // tensor is begun; one that changes during it discards the output, as any failed write does.
  source.check_unchanged(index);
  write_from(name, info.dtype, [&](uint64_t offset, void* dst, uint64_t nbytes) {
    source.read_bytes(index, offset, dst, nbytes);
    return true;
  });
}

}  // namespace peft
