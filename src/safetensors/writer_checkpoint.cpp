// TensorWriter::write_from_checkpoint: kept apart so that the writer core does not depend on the
// reading side.
#include <algorithm>

#include "core/error.hpp"
#include "safetensors/checkpoint.hpp"
#include "safetensors/writer.hpp"

namespace peft {

void TensorWriter::write_from_checkpoint(std::string_view name, const Checkpoint& source, size_t index) {
  require_streaming("write a tensor");
  start();
  const TensorInfo& info = source.tensor(index);  // INVALID_ARGUMENT when out of range
  if (next_ < slots_.size() && !in_tensor_ && tensor_at(next_).name == name) {
    const TensorDecl& decl = tensor_at(next_);
    if (!std::equal(decl.shape.begin(), decl.shape.end(), info.shape.begin(), info.shape.end())) {
      fail(PEFT_ERR_SHAPE_MISMATCH, "tensor " + quoted(decl.name) + ": the source tensor " + quoted(info.name) +
                                        " has a different shape");
    }
    source_bytes(decl, info.dtype);  // UNSUPPORTED before anything is written
  }
  // A mapped source is released page by page as it is consumed; the view itself comes first so an
  // I/O error of a pread-mode source is reported before the tensor is begun.
  const std::span<const uint8_t> bytes = source.view(index);
  write_span(name, info.dtype, bytes, /*release=*/true);
}

}  // namespace peft
