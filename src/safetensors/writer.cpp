#include "safetensors/writer.hpp"

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {

// ---- declarations ------------------------------------------------------------------------------

void TensorWriter::add_tensor(std::string name, DType dtype, std::vector<uint64_t> shape) {
  require_declaring("declare a tensor");
  if (by_name_.count(name) != 0) fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + " is declared twice");
  append_indexed(decls_, by_name_, make_tensor_decl(std::move(name), dtype, std::move(shape)));
}

void TensorWriter::set_metadata_present(bool present) {
  require_declaring("change the metadata");
  if (!present) {
    metadata_.reset();
  } else if (!metadata_) {
    metadata_.emplace();
  }
}

void TensorWriter::set_metadata(std::string key, std::string value) {
  require_declaring("change the metadata");
  check_metadata_entry(key, value);
  WriterMetadata updated = metadata_ ? metadata_ : WriterMetadata(std::in_place);
  (*updated)[std::move(key)] = std::move(value);
  metadata_ = std::move(updated);
}

// ---- planning ----------------------------------------------------------------------------------

StreamingWriter::StreamPlan TensorWriter::plan_stream() {
  std::vector<OutputSpec> specs = plan_outputs(decls_);
  std::vector<Output> outputs;
  std::vector<size_t> order;
  StreamPlan plan;
  order.reserve(decls_.size());
  for (OutputSpec& spec : specs) {
    Output out;
    out.layout = plan_file(decls_, spec.members, spec.metadata, spec.path);
    out.spec = std::move(spec);
    out.first_position = order.size();
    for (size_t d : out.layout.order) {
      plan.tensors.push_back({decls_[d].name, outputs.size(), decls_[d].dtype, 0});
      order.push_back(d);
    }
    plan.files.push_back({out.spec.path, std::move(out.layout.prefix), out.layout.file_size, false});
    outputs.push_back(std::move(out));
  }
  if (order.size() != decls_.size()) fail(PEFT_ERR_INTERNAL, "the output plan does not cover every tensor once");
  prepare_outputs();
  outputs_ = std::move(outputs);
  order_ = std::move(order);
  return plan;
}

const TensorDecl& TensorWriter::tensor_at(size_t position) const {
  return decls_.at(declaration_at(position));
}

size_t TensorWriter::declaration_at(size_t position) const {
  if (!started()) fail(PEFT_ERR_INVALID_ARGUMENT, "the writer's order is known once writing has started");
  if (position >= order_.size()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "position " + std::to_string(position) + " is out of range (the writer has " +
                                        std::to_string(order_.size()) + " tensors)");
  }
  return order_[position];
}

// ---- streaming ---------------------------------------------------------------------------------

uint64_t TensorWriter::source_bytes(size_t position, std::optional<DType> src) const {
  const TensorDecl& decl = tensor_at(position);
  return bytes_from(decl, src.value_or(decl.dtype));
}

uint64_t TensorWriter::bytes_from(const TensorDecl& decl, DType src_dtype) const {
  if (src_dtype == decl.dtype) return decl.nbytes;
  if (!is_valid_dtype(static_cast<int32_t>(src_dtype))) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(decl.name) + ": unknown source dtype " +
                                        std::to_string(static_cast<int32_t>(src_dtype)));
  }
  if (!can_convert(src_dtype, decl.dtype)) {
    fail(PEFT_ERR_UNSUPPORTED, "tensor " + quoted(decl.name) + ": cannot convert " +
                                   std::string(dtype_name(src_dtype)) + " to " + std::string(dtype_name(decl.dtype)));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(decl.elements, uint64_t{dtype_bits(src_dtype) / 8}, &bytes)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted(decl.name) + ": its source size overflows");
  }
  return bytes;
}

void TensorWriter::write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes) {
  require_streaming("write a tensor");
  start();
  if (is_next(name)) {
    const TensorDecl& decl = tensor_at(next_position());
    const uint64_t expected = bytes_from(decl, src_dtype);
    if (nbytes != expected) {
      fail(PEFT_ERR_TENSOR_INVALID_INFO, "tensor " + quoted(decl.name) + ": " + std::to_string(nbytes) +
                                             " bytes given but its shape and dtype " +
                                             std::string(dtype_name(src_dtype)) + " make " + std::to_string(expected));
    }
  }
  begin_tensor(name, src_dtype);  // reports the order errors
  if (in_tensor()) write(data, nbytes);
}

// ---- one file ----------------------------------------------------------------------------------

FileWriter::FileWriter(std::string path) : TensorWriter(std::nullopt), path_(std::move(path)) {
  if (path_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output path must not be empty");
}

std::vector<OutputSpec> FileWriter::plan_outputs(const std::vector<TensorDecl>& decls) {
  OutputSpec spec;
  spec.path = path_;
  spec.metadata = metadata();
  spec.members.resize(decls.size());
  for (size_t i = 0; i < decls.size(); ++i) spec.members[i] = i;
  return {std::move(spec)};
}

}  // namespace peft
