// The reference deserializes the header with serde_json into
//   struct HashMetadata { #[serde(rename="__metadata__")] metadata: Option<HashMap<String,String>>,
//                         #[serde(flatten)] tensors: HashMap<String, TensorInfo> }
//   struct TensorInfo { dtype: Dtype, shape: Vec<usize>, data_offsets: (usize, usize) }
// and that accepts and rejects more than the format's README says. Checked against the real
// package (safetensors 0.8.0, serde_json 1.0.150), this SAX handler reproduces it:
//  - JSON whitespace is space, tab, CR, LF only; a UTF-8 byte order mark is not whitespace.
//  - The root must be an object. "__metadata__" (also when spelled with \u escapes) must be null
//    (= absent) or an object of string values; duplicate keys inside it: the last one wins; the key
//    itself given twice is an error, even as null.
//  - Every other key is a tensor. Because serde buffers flattened entries and derived structs also
//    deserialize from sequences, a tensor may be an object {"dtype","shape","data_offsets"} (any
//    order, other keys ignored but still parsed, a known key twice is an error) or an array of
//    exactly those three values in that order.
//  - dtype is an exact variant name, or (serde's externally tagged enum form) an object with exactly
//    one key, the variant name, whose value is null: {"F32":null}.
//  - shape items and both data_offsets are integers in [0, 2^64-1]: no sign, no fraction, no
//    exponent ("-0", "1.0", "1e0" are all rejected; an integer above 2^64-1 is a float to serde).
//  - Nesting deeper than 127 levels fails (serde_json's recursion limit). We mirror it because it
//    changes which headers are accepted, and it also bounds the parser's stack: nlohmann's SAX
//    parser is iterative, and with the limit a 10,000-deep unknown field fails at depth 128 after
//    reading 128 bytes of it.
//  - Numbers that serde_json cannot represent as a finite f64 fail even in ignored fields; see
//    serde_number.hpp.
// Deliberately stricter than the reference: a tensor name given twice is rejected here (the
// reference keeps the last entry, which usually surfaces later as a misleading InvalidOffset).
#include "safetensors/header_json.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "safetensors/header_messages.hpp"
#include "safetensors/serde_number.hpp"

namespace peft {
namespace {

// Floats are lexed as long double so that a number just above DBL_MAX reaches number_float (with
// its text) instead of failing inside nlohmann's lexer: serde_json accepts some of those, and
// serde_json_number_in_range decides. (80- or 128-bit long double on the platforms we build for.)
using LexerJson = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                       std::uint64_t, long double>;

// What the next JSON value is for.
enum class Slot : uint8_t {
  Document,        // the whole header
  MetadataValue,   // the value of "__metadata__"
  MetadataString,  // a value inside "__metadata__"
  TensorValue,     // the value of a tensor name
  Dtype,
  DtypeUnit,       // the null in {"F32": null}
  Shape,
  ShapeDim,
  Offsets,
  OffsetItem,
  Ignored,         // an unknown tensor field, or anything inside one
};

enum class Frame : uint8_t {
  Root, Metadata, TensorObject, TensorArray, DtypeMap, Shape, Offsets, IgnoredObject, IgnoredArray
};

struct OpenContainer {
  Frame frame;
  uint32_t items = 0;  // values (arrays) or keys (dtype map) seen so far
};

class HeaderSax {
 public:
  // ---- nlohmann's SAX interface ----
  bool null() {
    const Slot slot = take_slot();
    switch (slot) {
      case Slot::MetadataValue:  // null means "no metadata", as Option's None
      case Slot::DtypeUnit:
      case Slot::Ignored:
        return true;
      default:
        return wrong_type(slot, "null");
    }
  }

  bool boolean(bool) {
    const Slot slot = take_slot();
    return slot == Slot::Ignored || wrong_type(slot, "a boolean");
  }

  bool number_integer(int64_t value) {  // nlohmann reports only numbers with a '-' sign here
    const Slot slot = take_slot();
    return slot == Slot::Ignored ||
           wrong_type(slot, value == 0 ? "-0" : "a negative integer " + std::to_string(value));
  }

  bool number_unsigned(uint64_t value) {
    const Slot slot = take_slot();
    switch (slot) {
      case Slot::ShapeDim:
        current_.shape.push_back(value);
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

  bool number_float(long double, const std::string& text) {
    const Slot slot = take_slot();
    if (slot == Slot::Ignored) {
      if (serde_json_number_in_range(text)) return true;
      return error("number out of range: " + clip(text));
    }
    const bool integral = text.find_first_of(".eE") == std::string::npos &&
                          text.find_first_not_of("-0123456789") == std::string::npos;
    return wrong_type(slot, integral ? "the integer " + clip(text) + " (above 2^64-1)"
                                     : "the non-integer number " + clip(text));
  }

  bool string(std::string& value) {
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

  bool binary(LexerJson::binary_t&) { return error("binary value in JSON"); }  // never in JSON

  bool start_object(std::size_t) {
    const Slot slot = take_slot();
    if (!enter()) return false;
    switch (slot) {
      case Slot::Document: return push(Frame::Root);
      case Slot::MetadataValue: has_metadata_ = true; return push(Frame::Metadata);
      case Slot::TensorValue: begin_tensor(); return push(Frame::TensorObject);
      case Slot::Dtype: return push(Frame::DtypeMap);
      case Slot::Ignored: return push(Frame::IgnoredObject);
      default: return wrong_type(slot, "an object");
    }
  }

  bool start_array(std::size_t) {
    const Slot slot = take_slot();
    if (!enter()) return false;
    switch (slot) {
      case Slot::TensorValue: begin_tensor(); return push(Frame::TensorArray);
      case Slot::Shape: current_.shape.clear(); return push(Frame::Shape);
      case Slot::Offsets: return push(Frame::Offsets);
      case Slot::Ignored: return push(Frame::IgnoredArray);
      default: return wrong_type(slot, "an array");
    }
  }

  bool key(std::string& name) {
    OpenContainer& top = open_.back();
    switch (top.frame) {
      case Frame::Root:
        if (name == "__metadata__") {
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
        if (name == "dtype") return known_field(have_dtype_, "dtype", Slot::Dtype);
        if (name == "shape") return known_field(have_shape_, "shape", Slot::Shape);
        if (name == "data_offsets") return known_field(have_offsets_, "data_offsets", Slot::Offsets);
        pending_ = Slot::Ignored;
        return true;
      case Frame::DtypeMap:
        if (++top.items > 1) return tensor_error("dtype given as an object must have exactly one key");
        pending_ = Slot::DtypeUnit;
        return set_dtype(name);
      default:  // IgnoredObject
        pending_ = Slot::Ignored;
        return true;
    }
  }

  bool end_object() {
    const OpenContainer top = open_.back();
    open_.pop_back();
    switch (top.frame) {
      case Frame::TensorObject:
        if (!have_dtype_) return tensor_error("missing field \"dtype\"");
        if (!have_shape_) return tensor_error("missing field \"shape\"");
        if (!have_offsets_) return tensor_error("missing field \"data_offsets\"");
        tensors_.push_back(std::move(current_));
        return true;
      case Frame::DtypeMap:
        if (top.items == 0) return tensor_error("dtype given as an object must have exactly one key");
        return true;
      default:
        return true;
    }
  }

  bool end_array() {
    const OpenContainer top = open_.back();
    open_.pop_back();
    switch (top.frame) {
      case Frame::TensorArray:
        if (top.items != 3) {
          return tensor_error("a tensor given as an array needs 3 items (dtype, shape, "
                              "data_offsets), found " + std::to_string(top.items));
        }
        tensors_.push_back(std::move(current_));
        return true;
      case Frame::Offsets:
        if (top.items != 2) {
          return tensor_error("data_offsets must have 2 items, found " + std::to_string(top.items));
        }
        return true;
      default:
        return true;
    }
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep its description.
    if (const size_t tag_end = what.find("] "); what.rfind("[json.exception.", 0) == 0 &&
                                                tag_end != std::string::npos) {
      what.erase(0, tag_end + 2);
    }
    return error("invalid JSON at byte " + std::to_string(position) + ": " + clip(what));
  }

  // ---- results ----
  const std::string& message() const { return message_; }

  HeaderJson take_result() {
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

 private:
  // The slot of the value that starts now: set by the preceding key inside objects, by position
  // inside arrays.
  Slot take_slot() {
    if (open_.empty()) return Slot::Document;
    OpenContainer& top = open_.back();
    switch (top.frame) {
      case Frame::TensorArray: {
        const uint32_t index = top.items++;
        if (index == 0) return Slot::Dtype;
        if (index == 1) return Slot::Shape;
        if (index == 2) return Slot::Offsets;
        return Slot::Ignored;  // too many items: reported when the array closes
      }
      case Frame::Shape: return Slot::ShapeDim;
      case Frame::Offsets:
        ++top.items;
        return top.items <= 2 ? Slot::OffsetItem : Slot::Ignored;  // reported when it closes
      case Frame::IgnoredArray: return Slot::Ignored;
      default: return pending_;
    }
  }

  bool enter() {
    if (open_.size() + 1 > kMaxJsonDepth) {
      return error("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    return true;
  }

  bool push(Frame frame) {
    open_.push_back({frame, 0});
    return true;
  }

  void begin_tensor() {
    current_.shape.clear();
    current_.begin = current_.end = 0;
    have_dtype_ = have_shape_ = have_offsets_ = false;  // only the object form uses these
  }

  bool known_field(bool& seen, const char* field, Slot slot) {
    if (seen) return tensor_error(std::string("duplicate field \"") + field + "\"");
    seen = true;
    pending_ = slot;
    return true;
  }

  bool set_dtype(const std::string& name) {
    const auto dtype = dtype_from_name(name);
    if (!dtype) return tensor_error("unknown dtype " + quoted_name(name) + " (names are case-sensitive)");
    current_.dtype = *dtype;
    return true;
  }

  bool wrong_type(Slot slot, const std::string& found) {
    switch (slot) {
      case Slot::Document: return error("the header must be a JSON object, found " + found);
      case Slot::MetadataValue:
        return error("\"__metadata__\" must be an object of strings or null, found " + found);
      case Slot::MetadataString:
        return error("\"__metadata__\" entry " + quoted_name(metadata_key_) +
                     " must be a string, found " + found);
      case Slot::TensorValue:
        return tensor_error("must be an object with dtype, shape and data_offsets, found " + found);
      case Slot::Dtype: return tensor_error("dtype must be a string, found " + found);
      case Slot::DtypeUnit: return tensor_error("dtype {\"NAME\": value} needs null, found " + found);
      case Slot::Shape: return tensor_error("shape must be an array, found " + found);
      case Slot::ShapeDim:
        return tensor_error("shape items must be integers in [0, 2^64-1], found " + found);
      case Slot::Offsets: return tensor_error("data_offsets must be an array, found " + found);
      case Slot::OffsetItem:
        return tensor_error("data_offsets items must be integers in [0, 2^64-1], found " + found);
      case Slot::Ignored: break;
    }
    return error("unexpected " + found);
  }

  bool tensor_error(const std::string& what) {
    return error("tensor " + quoted_name(current_.name) + ": " + what);
  }

  bool error(std::string message) {
    if (message_.empty()) message_ = std::move(message);
    return false;
  }

  // Numbers and nlohmann's messages may carry up to N bytes of input; keep messages short.
  static std::string clip(const std::string& text) {
    constexpr size_t kMax = 160;
    if (text.size() <= kMax) return text;
    size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    return text.substr(0, cut) + "...";
  }

  std::vector<OpenContainer> open_;
  Slot pending_ = Slot::Document;
  TensorInfo current_;
  bool have_dtype_ = false, have_shape_ = false, have_offsets_ = false;
  std::vector<TensorInfo> tensors_;
  bool metadata_seen_ = false;  // the key appeared (even as null)
  bool has_metadata_ = false;   // it was an object
  std::string metadata_key_;
  std::map<std::string, std::string> metadata_;  // sorted by key bytes; last value wins
  std::string message_;
};

void reject_duplicate_names(const std::vector<TensorInfo>& tensors) {
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (const TensorInfo& tensor : tensors) {
    if (!names.insert(tensor.name).second) {
      fail(PEFT_ERR_INVALID_HEADER, "tensor " + quoted_name(tensor.name) + " is listed twice");
    }
  }
}

}  // namespace

HeaderJson parse_header_json(std::string_view text) {
  // Two places where nlohmann's lexer is more lenient than serde_json: it skips a UTF-8 byte order
  // mark at the very start, and it takes a NUL byte for the end of the input (so "{}\0" would pass
  // as "{}"). A raw NUL is never valid JSON (inside strings it must be escaped), so any NUL fails.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    fail(PEFT_ERR_INVALID_HEADER, "invalid JSON at byte 0: a byte order mark is not allowed");
  }
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(PEFT_ERR_INVALID_HEADER, "invalid JSON at byte " + std::to_string(nul) +
                                      ": a NUL byte (padding must be JSON whitespace)");
  }
  HeaderSax sax;
  const bool ok = LexerJson::sax_parse(text.data(), text.data() + text.size(), &sax,
                                       nlohmann::json::input_format_t::json, /*strict=*/true,
                                       /*ignore_comments=*/false);
  if (!ok) {
    fail(PEFT_ERR_INVALID_HEADER,
         sax.message().empty() ? std::string("invalid JSON") : sax.message());
  }
  HeaderJson result = sax.take_result();
  reject_duplicate_names(result.tensors);
  return result;
}

}  // namespace peft
