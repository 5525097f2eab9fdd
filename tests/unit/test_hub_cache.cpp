// The hub cache module (src/checkpoint/hub_cache): model ids as huggingface_hub's validate_repo_id
// takes them, the cache folder from the environment as its constants.py computes it, and which
// texts resolve_model_location leaves to its caller. Resolution in a laid-out cache is tested from
// the C API, the CLI and against huggingface_hub itself (tests/capi/test_hub.c, tests/cli/hub_cache.sh,
// tests/interop/test_hub_cache.py).
#include <cstdlib>
#include <optional>
#include <string>

#include <doctest/doctest.h>
#include "checkpoint/hub_cache.hpp"
#include "test_error_support.hpp"

namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool is_id(const std::string& text) { return peft::parse_hub_model_id(text, nullptr).has_value(); }

}  // namespace

TEST_CASE("hub cache: model ids follow huggingface_hub's validate_repo_id") {
  for (const char* valid : {"gpt2", "org/name", "Org-1/na_me.v2", "a/b", "org/name@main", "org/name@refs/pr/3",
                            "org/name@0123456789abcdef0123456789abcdef01234567", "org/name@v1.0"})
    CHECK_MESSAGE(is_id(valid), valid);
  for (const char* invalid : {"", "/org/name", "a/b/c", "org/", "/name", "org/na..me", "org/name--x", "org/-name",
                              "org/name.", "org/name.git", "org/na me", "org/näme", "org/name@", "org/name@/x",
                              "org/name@a//b", "org/name@../x", "org/name@a/./b"})
    CHECK_MESSAGE(!is_id(invalid), invalid);
  CHECK(is_id("org/" + std::string(96, 'x')));
  CHECK(!is_id("org/" + std::string(97, 'x')));

  std::string why;
  const auto id = peft::parse_hub_model_id("org/name@refs/pr/3", &why);
  REQUIRE(id);
  CHECK(id->repo == "org/name");
  CHECK(id->revision == "refs/pr/3");
  CHECK(peft::parse_hub_model_id("org/name", &why)->revision == "main");
  CHECK(!peft::parse_hub_model_id("a/b/c", &why));
  CHECK(why.find("one '/' at most") != std::string::npos);
}

TEST_CASE("hub cache: the folder comes from the environment as huggingface_hub's constants compute it") {
  EnvVar home("HOME", "/home/u");
  EnvVar hub("HF_HUB_CACHE", std::nullopt);
  EnvVar legacy("HUGGINGFACE_HUB_CACHE", std::nullopt);
  EnvVar hf_home("HF_HOME", std::nullopt);
  EnvVar xdg("XDG_CACHE_HOME", std::nullopt);
  CHECK(peft::hub_cache_dir() == "/home/u/.cache/huggingface/hub");
  {
    EnvVar set("XDG_CACHE_HOME", "/xdg/");
    CHECK(peft::hub_cache_dir() == "/xdg/huggingface/hub");
    EnvVar home_set("HF_HOME", "~/hf");
    CHECK(peft::hub_cache_dir() == "/home/u/hf/hub");
    EnvVar vars("HF_HOME", "$HOME/a/${HOME}/$PEFT_TEST_UNSET_VARIABLE/${}/$");
    CHECK(peft::hub_cache_dir() == "/home/u/a//home/u/$PEFT_TEST_UNSET_VARIABLE/${}/$/hub");
    EnvVar legacy_set("HUGGINGFACE_HUB_CACHE", "/legacy");
    CHECK(peft::hub_cache_dir() == "/legacy");
    EnvVar hub_set("HF_HUB_CACHE", "~");
    CHECK(peft::hub_cache_dir() == "/home/u");
    EnvVar empty("HF_HUB_CACHE", "");  // empty counts as unset
    CHECK(peft::hub_cache_dir() == "/legacy");
  }
}

TEST_CASE("hub cache: resolve_model_location leaves paths and non-ids to the caller") {
  EnvVar hub("HF_HUB_CACHE", "/nonexistent-peft-test-cache");
  for (const char* text : {"/no/such/folder", "../no/such", "no-such-folder", "a/b/c", "out/model.safetensors"})
    CHECK(peft::resolve_model_location(text) == text);
  CHECK(error_test::code_of([] { peft::resolve_model_location("org/absent"); }) == PEFT_ERR_NOT_FOUND);
  CHECK(error_test::code_of([] { peft::resolve_path_or_hub_id("no-such-folder"); }) == PEFT_ERR_NOT_FOUND);
  CHECK(error_test::code_of([] { peft::resolve_path_or_hub_id("/no/such/folder"); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_test::code_of([] { peft::resolve_hub_model_id("org/name@"); }) == PEFT_ERR_INVALID_ARGUMENT);
}
