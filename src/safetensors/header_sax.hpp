// The semantic half of step 6: a SAX handler that turns JSON events into tensor entries and
// metadata, rejecting exactly what the reference's serde types reject. It knows nothing about
// bytes; StrictJsonReader (production) or nlohmann's SAX parser (cross-check) feed it events.
//
// The reference deserializes the header with serde_json into
//   struct HashMetadata { #[serde(rename="__metadata__")] metadata: Option<HashMap<String,String>>,
//                         #[serde(flatten)] tensors: HashMap<String, TensorInfo> }
//   struct TensorInfo { dtype: Dtype, shape: Vec<usize>, data_offsets: (usize, usize) }
// which accepts and rejects more than the format's README says. Checked against the real package
// (safetensors 0.8.0 with serde_json 1.0.150; tests/fuzz/differential.py), this handler does:
//  - The root must be an object. "__metadata__" (also when spelled with \u escapes) must be null
//    (= absent) or an object of string values; inside it a repeated key: the last value wins; the
//    key "__metadata__" itself given twice is an error, even as null.
//  - Every other key is a tensor: an object {"dtype","shape","data_offsets"} in any order; other
//    keys are ignored but must still be valid JSON; a known key twice is an error.
//  - dtype is an exact, case-sensitive variant name.
//  - shape items and both data_offsets are integers in [0, 2^64-1]: no sign, fraction or exponent
//    ("-0", "1.0" and "1e0" all fail; an integer above 2^64-1 is a float to serde, so it fails).
//  - Nesting deeper than 127 levels fails: serde_json's recursion limit (an object or array opening
//    at depth 128, the root being depth 1). We mirror it because it decides which headers are
//    accepted; it also bounds the parser's stack, so a 10,000-deep unknown field costs 128 steps.
//  - Numbers that serde_json cannot hold as a finite f64 fail even in ignored fields
//    (serde_number.hpp).
// Deliberately stricter than the reference (each message says so), like the fixtures in
// tests/fixtures/malformed expect:
//  - a tensor name given twice (parse_header, after this step); the reference keeps the last entry;
//  - two serde artifacts no writer produces: serde builds structs from sequences too and reads
//    enums in their externally tagged form, so the reference also accepts a tensor written as the
//    array ["F32",[1],[0,4]] and a dtype written as {"F32":null}. We take only the object form and
//    the plain string, so that what we accept is what the format describes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "safetensors/header_types.hpp"

namespace peft {

// The reference's JSON nesting limit: serde_json fails with "recursion limit exceeded" when an
// object or array opens at depth 128 (the root object is depth 1).
inline constexpr size_t kMaxHeaderJsonDepth = 127;

class HeaderSax {
 public:
  // ---- SAX events (the method names and signatures nlohmann's sax_parse expects) ----
  bool null();
  bool boolean(bool value);
  bool number_integer(int64_t value);  // an integer with a '-' sign: never valid in a typed field
  bool number_unsigned(uint64_t value);
  bool number_float(long double value, const std::string& text);  // decided from the text
  bool string(std::string& value);
  bool start_object(std::size_t elements);
  bool key(std::string& name);
  bool end_object();
  bool start_array(std::size_t elements);
  bool end_array();
  bool syntax_error(std::size_t byte_offset, const std::string& what);

  // nlohmann's spellings of two events; JSON text has no binary values.
  template <class Binary>
  bool binary(Binary&) { return error("binary value"); }
  template <class Exception>
  bool parse_error(std::size_t byte_offset, const std::string&, const Exception& e) {
    return syntax_error(byte_offset, e.what());
  }

  // ---- results ----
  const std::string& message() const { return message_; }  // why the parse stopped
  HeaderJson take_result();

 private:
  // What the next JSON value is for.
  enum class Slot : uint8_t {
    Document,        // the whole header
    MetadataValue,   // the value of "__metadata__"
    MetadataString,  // a value inside "__metadata__"
    TensorValue,     // the value of a tensor name
    Dtype,
    Shape,
    ShapeDim,
    Offsets,
    OffsetItem,
    Ignored,         // an unknown tensor field, anything inside one, or surplus offsets
  };
  enum class Frame : uint8_t {
    Root, Metadata, TensorObject, Shape, Offsets, IgnoredObject, IgnoredArray
  };
  struct OpenContainer {
    Frame frame;
    uint32_t items;  // values seen so far (data_offsets)
  };

  Slot take_slot();
  bool open(Frame frame);
  void begin_tensor();
  bool known_field(bool& seen, const char* field, Slot slot);
  bool set_dtype(const std::string& name);
  bool wrong_type(Slot slot, const std::string& found);
  bool tensor_error(const std::string& what);
  bool error(std::string message);

  std::vector<OpenContainer> open_;
  Slot pending_ = Slot::Document;  // set by key() for the value that follows
  TensorInfo current_;
  std::vector<uint64_t> dims_;  // the shape being read; its capacity is kept from tensor to tensor
  bool have_dtype_ = false, have_shape_ = false, have_offsets_ = false;  // seen in this tensor
  std::vector<TensorInfo> tensors_;
  bool metadata_seen_ = false;  // the key appeared (even as null)
  bool has_metadata_ = false;   // it was an object
  std::string metadata_key_;
  std::map<std::string, std::string> metadata_;  // sorted by key bytes; last value wins
  std::string message_;
};

}  // namespace peft
