// peftc doctor --adapter A [--base B] [--json] [--fix OUT_DIR]: checks an adapter against a base
// checkpoint without merging (peft_adapter_doctor) and prints the report, as text or as the JSON
// the C API returns; --fix writes a copy with the known renames applied (peft_adapter_doctor_fix)
// and checks the copy again. Exit status: 0 clean (with --fix: the copy is clean), 1 problems found
// (with --fix: problems remain in the copy), 2 errors and usage errors.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // a third-party parser for the report; the library is reached through peft_c.h alone

#include "arguments.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage = "doctor --adapter DIR [--base DIR] [--json] [--fix OUT_DIR]";

int error_exit(peft_error* err) {
  report(err);
  return kExitUsage;  // the doctor's "error" status is 2: 1 means problems found
}

// The report as JSON; nullopt (after a message) when the library returned text that is not JSON.
std::optional<nlohmann::json> parse_report(char* text) {
  std::optional<nlohmann::json> out;
  try {
    out = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "peftc: error: the doctor's report is not JSON: %s\n", e.what());
  }
  peft_string_free(text);
  return out;
}

std::string text_of(const nlohmann::json& value) {
  if (value.is_null()) return "-";
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

void print_report(const nlohmann::json& r) {
  const auto& s = r["summary"];
  std::printf("adapter: %s\n", text_of(r["adapter"]).c_str());
  std::printf("base:    %s%s\n", text_of(r["base"]).c_str(),
              r["family"].is_null() ? "" : (" (family " + text_of(r["family"]) + ")").c_str());
  std::printf("modules: %s, %s matched to base tensors\n", text_of(s["modules"]).c_str(),
              text_of(s["matched_modules"]).c_str());
  for (const auto& m : r["modules"]) {
    std::string line = "  " + text_of(m["module"]) + "  " + text_of(m["kind"]) + " " + text_of(m["dtype"]);
    if (!m["rank"].is_null())
      line += "  r=" + text_of(m["rank"]) + " alpha=" + text_of(m["alpha"]) + " scaling=" + text_of(m["scaling"]);
    if (!m["dora"].is_null()) line += "  dora=" + text_of(m["dora"]);
    if (!m["base_tensor"].is_null())
      line += "  -> " + text_of(m["base_tensor"]) + " " + m["base_shape"].dump() + " " + text_of(m["base_dtype"]);
    if (!m["host_name"].is_null()) line += "  host=" + text_of(m["host_name"]);
    std::printf("%s\n", line.c_str());
  }
  if (const auto& t = r["tied_embeddings"]; t.is_object()) {
    std::printf("tied embeddings: %s and %s (%s), case %s\n", text_of(t["input"]).c_str(), text_of(t["output"]).c_str(),
                text_of(t["config_key"]).c_str(), text_of(t["case"]).c_str());
    std::printf("  merge --tied-embeddings untie (default): %s\n", text_of(t["untie"]).c_str());
    std::printf("  merge --tied-embeddings shared: %s\n", text_of(t["shared"]).c_str());
  }
  std::printf("problems: %s (%s with a known fix)\n", text_of(s["problems"]).c_str(),
              text_of(s["fixable_problems"]).c_str());
  for (const auto& p : r["problems"]) {
    std::printf("  [%s] %s\n", text_of(p["kind"]).c_str(), text_of(p["message"]).c_str());
    if (!p["fix"].is_null())
      for (const auto& rename : p["fix"]["renames"])
        std::printf("      fix: %s -> %s\n", text_of(rename["from"]).c_str(),
                    rename["to"].is_null() ? "(config entry)" : text_of(rename["to"]).c_str());
  }
  if (!r["config_changes"].empty()) {
    std::printf("config changes the fix makes: %zu\n", r["config_changes"].size());
    for (const auto& c : r["config_changes"])
      std::printf("  %s[%s] = %s\n", text_of(c["field"]).c_str(), text_of(c["key"]).c_str(),
                  text_of(c["value"]).c_str());
  }
}

int doctor_command(const std::vector<std::string>& args) {
  std::optional<std::string> adapter, base, fix;
  bool json = false;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == "--adapter" || arg == "--base" || arg == "--fix") {
      auto v = a.value();
      if (!v || v->empty()) return usage_error(arg + " needs a folder", kUsage);
      (arg == "--adapter" ? adapter : arg == "--base" ? base : fix) = *v;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else {
      return usage_error("unexpected argument '" + a.raw() + "'", kUsage);
    }
  }
  if (!adapter) return usage_error("doctor needs --adapter", kUsage);
  const char* base_dir = base ? base->c_str() : nullptr;
  char* text = nullptr;
  peft_error* err = fix ? peft_adapter_doctor_fix(adapter->c_str(), base_dir, fix->c_str(), &text)
                        : peft_adapter_doctor(adapter->c_str(), base_dir, &text);
  if (err) return error_exit(err);
  const std::optional<nlohmann::json> parsed_input = parse_report(text);
  if (!parsed_input) return kExitUsage;
  const nlohmann::json& input = *parsed_input;
  bool clean = input["summary"]["ok"].get<bool>();
  if (json) {
    std::printf("%s\n", input.dump(2).c_str());
  } else {
    print_report(input);
  }
  if (fix) {
    if (peft_error* again = peft_adapter_doctor(fix->c_str(), base_dir, &text)) return error_exit(again);
    const std::optional<nlohmann::json> parsed_output = parse_report(text);
    if (!parsed_output) return kExitUsage;
    const nlohmann::json& output = *parsed_output;
    clean = output["summary"]["ok"].get<bool>();
    const size_t remaining = output["problems"].size();
    std::fprintf(json ? stderr : stdout, "fixed adapter written to %s: %zu key(s) renamed, %zu problem(s) remain\n",
                 fix->c_str(), input["renames"].size(), remaining);
    if (!json)
      for (const auto& p : output["problems"])
        std::printf("  remaining [%s] %s\n", text_of(p["kind"]).c_str(), text_of(p["message"]).c_str());
  } else if (!json) {
    std::printf("%s\n", clean ? "clean" : "problems found");
  }
  return clean ? kExitOk : kExitFailure;
}

const bool registered = register_command({"doctor", kUsage, &doctor_command});

}  // namespace
}  // namespace peftc
