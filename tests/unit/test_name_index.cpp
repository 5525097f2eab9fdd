// The name index behind every duplicate check and find by name (core/name_index.hpp).
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/name_index.hpp"

namespace {

struct Names {
  std::vector<std::string> list;
  auto index() {
    return peft::NameIndex([this](size_t i) { return std::string_view(list[i]); });
  }
};

}  // namespace

TEST_CASE("name index: every name found at its position, a repeat answers the first, absent names are not found") {
  Names names;
  auto index = names.index();
  CHECK_FALSE(index.find("anything").has_value());  // an empty index
  // Names that differ only in their length, a zero byte, or one byte at the word and 16-byte edges.
  const std::vector<std::string> edges = {
      "", std::string(1, '\0'), std::string(2, '\0'), "a", std::string("a\0", 2), "abcdefgh", "abcdefgi",
      "abcdefghijklmnop", "abcdefghijklmnoq", "abcdefghijklmnopq", "abcdefghijklmnopr", std::string(33, 'x')};
  for (const std::string& name : edges) {
    names.list.push_back(name);
    CHECK_FALSE(index.insert(name, names.list.size() - 1).has_value());
  }
  // Enough names to grow the table many times (no reserve), with the same long prefix.
  for (int i = 0; i < 50000; ++i) {
    names.list.push_back("model.layers." + std::to_string(i) + ".self_attn.q_proj.weight");
    CHECK_FALSE(index.insert(names.list.back(), names.list.size() - 1).has_value());
  }
  REQUIRE(index.size() == names.list.size());
  for (size_t i = 0; i < names.list.size(); ++i) {
    const auto found = index.find(names.list[i]);
    REQUIRE(found.has_value());
    REQUIRE(*found == i);
  }
  // A repeat adds nothing and names the position it was first added at.
  const auto repeat = index.insert(names.list[7], 123456);
  REQUIRE(repeat.has_value());
  CHECK(*repeat == 7);
  CHECK(index.size() == names.list.size());
  CHECK_FALSE(index.find("model.layers.50000.self_attn.q_proj.weight").has_value());
  CHECK_FALSE(index.find("abcdefghijklmno").has_value());
  CHECK_FALSE(index.find(std::string(3, '\0')).has_value());
}

TEST_CASE("name index: reserve keeps every entry; a position the slots cannot hold is refused") {
  Names names;
  auto index = names.index();
  names.list = {"one", "two"};
  index.insert("one", 0);
  index.reserve(1000);
  index.insert("two", 1);
  CHECK(index.find("one") == 0u);
  CHECK(index.find("two") == 1u);
  try {
    index.insert("three", size_t{UINT32_MAX} - 1);
    FAIL("expected an error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
  }
}
