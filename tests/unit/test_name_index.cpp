// The name index behind every duplicate check and find by name (core/name_index.hpp).
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/name_index.hpp"

namespace {

// A list of names and its index, added to and searched together.
struct Names {
  std::vector<std::string> list;
  peft::NameIndex index;
  std::string_view operator()(size_t i) const { return list[i]; }
  std::optional<size_t> add(const std::string& name) {
    list.push_back(name);
    return index.insert(name, list.size() - 1, *this);
  }
  std::optional<size_t> find(std::string_view name) const { return index.find(name, *this); }
};

}  // namespace

TEST_CASE("name index: every name found at its position, a repeat answers the first, absent names are not found") {
  Names names;
  CHECK_FALSE(names.find("anything").has_value());  // an empty index
  // Names that differ only in their length, a zero byte, or one byte at the word and 16-byte edges.
  const std::vector<std::string> edges = {
      "", std::string(1, '\0'), std::string(2, '\0'), "a", std::string("a\0", 2), "abcdefgh", "abcdefgi",
      "abcdefghijklmnop", "abcdefghijklmnoq", "abcdefghijklmnopq", "abcdefghijklmnopr", std::string(33, 'x')};
  for (const std::string& name : edges) CHECK_FALSE(names.add(name).has_value());
  // Enough names to grow the table many times (no reserve), with the same long prefix.
  for (int i = 0; i < 50000; ++i) {
    REQUIRE_FALSE(names.add("model.layers." + std::to_string(i) + ".self_attn.q_proj.weight").has_value());
  }
  REQUIRE(names.index.size() == names.list.size());
  for (size_t i = 0; i < names.list.size(); ++i) {
    const auto found = names.find(names.list[i]);
    REQUIRE(found.has_value());
    REQUIRE(*found == i);
  }
  // A repeat adds nothing and names the position it was first added at.
  const auto repeat = names.index.insert(names.list[7], 123456, names);
  REQUIRE(repeat.has_value());
  CHECK(*repeat == 7);
  CHECK(names.index.size() == names.list.size());
  CHECK_FALSE(names.find("model.layers.50000.self_attn.q_proj.weight").has_value());
  CHECK_FALSE(names.find("abcdefghijklmno").has_value());
  CHECK_FALSE(names.find(std::string(3, '\0')).has_value());
}

TEST_CASE("name index: reserve keeps every entry; a position the slots cannot hold is refused") {
  Names names;
  names.add("one");
  names.index.reserve(1000);
  names.add("two");
  CHECK(names.find("one") == 0u);
  CHECK(names.find("two") == 1u);
  try {
    names.index.insert("three", size_t{UINT32_MAX} - 1, names);
    FAIL("expected an error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
  }
}
