#include "safetensors/header_sax.hpp"

#include <cstring>

#include "core/dtype.hpp"
#include "safetensors/header_messages.hpp"
#include "safetensors/serde_number.hpp"

namespace peft {
namespace {

// Numbers and parser messages can carry up to N bytes of input; keep messages short.
std::string clip(const std::string& text) {
  constexpr size_t kMax = 160;
  if (text.size() <= kMax) return text;
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// `text` == `word`, with a memcmp of constant length that compilers inline (this runs for every key).
template <size_t N>
bool equals(const std::string& text, const char (&word)[N]) {
  return text.size() == N - 1 && std::memcmp(text.data(), word, N - 1) == 0;
}

// Appended where the reference accepts a serde artifact that we reject on purpose.
constexpr const char* kStricter = " (stricter than the reference, on purpose)";

}  // namespace

bool HeaderSax::null() {
  const Slot slot = take_slot();
  switch (slot) {
    case Slot::MetadataValue:  // null means "no metadata", like Option's None
    case Slot::Ignored:
      return true;
    default:
      return wrong_type(slot, "null");
  }
}

bool HeaderSax::boolean(bool) {
  const Slot slot = take_slot();
  return slot == Slot::Ignored || wrong_type(slot, "a boolean");
}

bool HeaderSax::number_integer(int64_t value) {
  const Slot slot = take_slot();
  return slot == Slot::Ignored ||
         wrong_type(slot, value == 0 ? std::string("-0") : "the negative integer " + std::to_string(value));
}

bool HeaderSax::number_unsigned(uint64_t value) {
  const Slot slot = take_slot();
  switch (slot) {
    case Slot::ShapeDim:
      dims_.push_back(value);
      return true;
    case Slot::OffsetItem:
      (open_.back().items == 1 ? current_.begin : current_.end) = value;
      return true;
    case Slot::Ignored:
      return true;
    default:
      return wrong_type(slot, "the integer " + std::to_string(value));
  }
}

bool HeaderSax::number_float(long double, const std::string& text) {
  const Slot slot = take_slot();
  if (slot == Slot::Ignored) {
    return serde_json_number_in_range(text) || error("number out of range: " + clip(text));
  }
  const bool integral = text.find_first_not_of("-0123456789") == std::string::npos;
  return wrong_type(slot, integral ? "the integer " + clip(text) + " (outside [0, 2^64-1])"
                                   : "the non-integer number " + clip(text));
}

bool HeaderSax::string(std::string& value) {
  const Slot slot = take_slot();
  switch (slot) {
    case Slot::MetadataString:
      metadata_.insert_or_assign(std::move(metadata_key_), std::move(value));
      return true;
    case Slot::Dtype:
      return set_dtype(value);
    case Slot::Ignored:
      return true;
    default:
      return wrong_type(slot, "a string");
  }
}

bool HeaderSax::start_object(std::size_t) {
  const Slot slot = take_slot();
  switch (slot) {
    case Slot::Document: return open(Frame::Root);
    case Slot::MetadataValue: has_metadata_ = true; return open(Frame::Metadata);
    case Slot::TensorValue: begin_tensor(); return open(Frame::TensorObject);
    case Slot::Ignored: return open(Frame::IgnoredObject);
    default: return wrong_type(slot, "an object");
  }
}

bool HeaderSax::start_array(std::size_t) {
  const Slot slot = take_slot();
  switch (slot) {
    case Slot::Shape: dims_.clear(); return open(Frame::Shape);
    case Slot::Offsets: return open(Frame::Offsets);
    case Slot::Ignored: return open(Frame::IgnoredArray);
    default: return wrong_type(slot, "an array");
  }
}

bool HeaderSax::key(std::string& name) {
  OpenContainer& top = open_.back();
  switch (top.frame) {
    case Frame::Root:
      if (equals(name, "__metadata__")) {
        if (metadata_seen_) return error("\"__metadata__\" is given twice");
        metadata_seen_ = true;
        pending_ = Slot::MetadataValue;
      } else {
        current_.name = std::move(name);
        pending_ = Slot::TensorValue;
      }
      return true;
    case Frame::Metadata:
      metadata_key_ = std::move(name);
      pending_ = Slot::MetadataString;
      return true;
    case Frame::TensorObject:
      if (equals(name, "dtype")) return known_field(have_dtype_, "dtype", Slot::Dtype);
      if (equals(name, "shape")) return known_field(have_shape_, "shape", Slot::Shape);
      if (equals(name, "data_offsets")) return known_field(have_offsets_, "data_offsets", Slot::Offsets);
      pending_ = Slot::Ignored;
      return true;
    default:  // IgnoredObject
      pending_ = Slot::Ignored;
      return true;
  }
}

bool HeaderSax::end_object() {
  const OpenContainer top = open_.back();
  open_.pop_back();
  switch (top.frame) {
    case Frame::TensorObject:
      if (!have_dtype_) return tensor_error("missing field \"dtype\"");
      if (!have_shape_) return tensor_error("missing field \"shape\"");
      if (!have_offsets_) return tensor_error("missing field \"data_offsets\"");
      tensors_.push_back(std::move(current_));
      return true;
    default:
      return true;
  }
}

bool HeaderSax::end_array() {
  const OpenContainer top = open_.back();
  open_.pop_back();
  switch (top.frame) {
    case Frame::Shape:  // one allocation of the exact size for the stored shape
      current_.shape.assign(dims_.begin(), dims_.end());
      return true;
    case Frame::Offsets:
      return top.items == 2 ||
             tensor_error("data_offsets must have 2 items, found " + std::to_string(top.items));
    default:
      return true;
  }
}

bool HeaderSax::syntax_error(std::size_t byte_offset, const std::string& what) {
  std::string text = what;
  // nlohmann prefixes "[json.exception.parse_error.101] "; the description after it is enough.
  if (text.rfind("[json.exception.", 0) == 0) {
    if (const size_t tag_end = text.find("] "); tag_end != std::string::npos) text.erase(0, tag_end + 2);
  }
  return error("invalid JSON at header byte " + std::to_string(byte_offset) + ": " + clip(text));
}

HeaderJson HeaderSax::take_result() {
  HeaderJson result;
  result.tensors = std::move(tensors_);
  if (has_metadata_) {
    Metadata metadata;
    metadata.reserve(metadata_.size());
    for (auto& [key, value] : metadata_) metadata.emplace_back(key, std::move(value));
    result.metadata = std::move(metadata);
  }
  return result;
}

// The slot of the value that starts now: set by the preceding key inside objects, by position
// inside arrays.
HeaderSax::Slot HeaderSax::take_slot() {
  if (open_.empty()) return Slot::Document;
  OpenContainer& top = open_.back();
  switch (top.frame) {
    case Frame::Shape:
      return Slot::ShapeDim;
    case Frame::Offsets:
      // A third item is reported when the array closes.
      return ++top.items <= 2 ? Slot::OffsetItem : Slot::Ignored;
    case Frame::IgnoredArray:
      return Slot::Ignored;
    default:
      return pending_;
  }
}

bool HeaderSax::open(Frame frame) {
  if (open_.size() + 1 > kMaxHeaderJsonDepth) {
    return error("JSON nested deeper than " + std::to_string(kMaxHeaderJsonDepth) + " levels");
  }
  open_.push_back({frame, 0});
  return true;
}

void HeaderSax::begin_tensor() {
  current_.shape.clear();
  current_.begin = current_.end = 0;
  have_dtype_ = have_shape_ = have_offsets_ = false;  // only the object form uses these
}

bool HeaderSax::known_field(bool& seen, const char* field, Slot slot) {
  if (seen) return tensor_error(std::string("duplicate field \"") + field + "\"");
  seen = true;
  pending_ = slot;
  return true;
}

bool HeaderSax::set_dtype(const std::string& name) {
  const auto dtype = dtype_from_name(name);
  if (!dtype) return tensor_error("unknown dtype " + quoted_name(name) + " (names are case-sensitive)");
  current_.dtype = *dtype;
  return true;
}

bool HeaderSax::wrong_type(Slot slot, const std::string& found) {
  switch (slot) {
    case Slot::Document: return error("the header must be a JSON object, found " + found);
    case Slot::MetadataValue:
      return error("\"__metadata__\" must be an object of strings or null, found " + found);
    case Slot::MetadataString:
      return error("\"__metadata__\" entry " + quoted_name(metadata_key_) + " must be a string, found " + found);
    case Slot::TensorValue:
      return tensor_error("must be an object with dtype, shape and data_offsets, found " + found +
                          (found == "an array" ? kStricter : ""));
    case Slot::Dtype:
      return tensor_error("dtype must be a string, found " + found + (found == "an object" ? kStricter : ""));
    case Slot::Shape: return tensor_error("shape must be an array, found " + found);
    case Slot::ShapeDim: return tensor_error("shape items must be integers in [0, 2^64-1], found " + found);
    case Slot::Offsets: return tensor_error("data_offsets must be an array, found " + found);
    case Slot::OffsetItem:
      return tensor_error("data_offsets items must be integers in [0, 2^64-1], found " + found);
    case Slot::Ignored: break;
  }
  return error("unexpected " + found);
}

bool HeaderSax::tensor_error(const std::string& what) {
  return error("tensor " + quoted_name(current_.name) + ": " + what);
}

bool HeaderSax::error(std::string message) {
  if (message_.empty()) message_ = std::move(message);
  return false;
}

}  // namespace peft
