#include "core/json_parse.hpp"

#include <cstddef>
#include <functional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace peft {
namespace {

// Builds the document from nlohmann's SAX events, as its own DOM parser does, but refuses to open a
// container deeper than kMaxJsonDepth, and finds repeated keys of an ordered object through a hash
// of each key (std::map objects find them in log time by themselves).
template <class Json>
class BoundedBuilder {
 public:
  using string_t = typename Json::string_t;
  using object_t = typename Json::object_t;
  using array_t = typename Json::array_t;
  static constexpr bool kOrdered = std::is_same_v<Json, nlohmann::ordered_json>;

  Json root;
  std::string error;  // set when a handler stops the parse

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(typename Json::number_integer_t v) { return put(v); }
  bool number_unsigned(typename Json::number_unsigned_t v) { return put(v); }
  bool number_float(typename Json::number_float_t v, const string_t&) { return put(v); }
  bool string(string_t& v) { return put(std::move(v)); }
  bool binary(typename Json::binary_t&) {
    error = "binary values are not JSON";  // never sent for JSON input
    return false;
  }

  bool start_object(size_t) { return open(nlohmann::json::value_t::object); }
  bool start_array(size_t) { return open(nlohmann::json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& key) {
    Frame& frame = stack_.back();
    object_t& object = frame.value->template get_ref<object_t&>();
    if constexpr (kOrdered) {
      const size_t hash = std::hash<string_t>{}(key);
      for (auto [it, last] = frame.positions.equal_range(hash); it != last; ++it) {
        auto& [existing, value] = *(object.begin() + static_cast<std::ptrdiff_t>(it->second));
        if (existing == key) {
          slot_ = &value;  // the last value wins, in the first position
          return true;
        }
      }
      frame.positions.emplace(hash, object.size());
      object.Container::emplace_back(std::move(key), nullptr);
      slot_ = &object.back().second;
    } else {
      slot_ = &object[std::move(key)];
    }
    return true;
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    error = std::string("invalid JSON (") + e.what() + ")";
    return false;
  }

 private:
  struct Frame {
    Json* value;
    std::unordered_multimap<size_t, size_t> positions;  // key hash -> index in the ordered object
  };

  // Stores a value where the parse stands and returns where it went.
  template <class Value>
  Json* place(Value&& v) {
    if (stack_.empty()) {
      root = Json(std::forward<Value>(v));
      return &root;
    }
    Json& parent = *stack_.back().value;
    if (parent.is_array()) {
      array_t& array = parent.template get_ref<array_t&>();
      array.emplace_back(std::forward<Value>(v));
      return &array.back();
    }
    *slot_ = Json(std::forward<Value>(v));
    return slot_;
  }
  template <class Value>
  bool put(Value&& v) {
    place(std::forward<Value>(v));
    return true;
  }

  bool open(nlohmann::json::value_t type) {
    if (stack_.size() >= kMaxJsonDepth) {
      error = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    // A container is filled while it is on top of the stack, and its parent is not touched until it
    // is closed, so the pointer stays valid.
    stack_.push_back(Frame{place(type), {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::vector<Frame> stack_;
  Json* slot_ = nullptr;  // the value of the object key just read
};

template <class Json>
Json parse_bounded(std::string_view text, int32_t code, const std::string& source) {
  BoundedBuilder<Json> builder;
  if (!Json::sax_parse(text.begin(), text.end(), &builder)) {
    // The document built so far is at most kMaxJsonDepth deep: destroying it is safe.
    fail(code, source + ": " + (builder.error.empty() ? std::string("invalid JSON") : builder.error));
  }
  return std::move(builder.root);
}

}  // namespace

nlohmann::ordered_json parse_json_ordered(std::string_view text, int32_t code, const std::string& source) {
  return parse_bounded<nlohmann::ordered_json>(text, code, source);
}

nlohmann::json parse_json(std::string_view text, int32_t code, const std::string& source) {
  return parse_bounded<nlohmann::json>(text, code, source);
}

}  // namespace peft
