// Test driver for tests/interop/test_merge_math.py: runs the library's merge math on raw inputs
// that the pytest wrote next to a JSON spec, and writes raw outputs for it to compare with PEFT.
//
// Usage: merge_math_driver SPEC.json   (file names in the spec are relative to its folder)
//
// Spec: {"cases": [case, ...]} where a case is one of
//   {"op": "merge", "kind": "linear|conv1d_gpt2|embedding|conv",
//    "weight": {"file", "dtype": "F32|BF16|F16", "shape": [...]},
//    "terms": [{"a": {"file", "shape"}, "b": {"file", "shape"}, "coefficient": c}, ...],   (f32)
//    "magnitude": {"file"}?, "out_norm": "file"?,  DoRA: dora_merge, and the norm it used
//    "unmerge_norm": {"file"}?,                   DoRA: the norm to unmerge with (default: ours)
//    "bias": {"file", "dtype", "shape"}?, "lora_bias": {"file"}?, "out_bias": "file"?,
//    "out_weight": "file",
//    "unmerge_input": {"file"}?, "out_unmerged": "file"?}   unmerge that weight (same dtype/shape)
//   {"op": "combine", "method": "cat|linear", "out": n, "in": n,
//    "adapters": [{"a": {"file"}, "b": {"file"}, "rank": r, "scaling": s, "weight": w}, ...],
//    "out_a": "file", "out_b": "file"}
//   {"op": "randperm", "n": n, "seed": s, "count": c, "out": "file"}      torch_randperm, int64
//   {"op": "fourierft", "spectrum": {"file"}, "seed": s, "scale": x, "out": n, "in": n,
//    "out_delta": "file"}                                                fourierft_delta, f32 [out, in]
// Exit status 0 on success; 1 with a message on stderr otherwise.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/methods/lora_math.hpp"
#include "peft/methods/peft_methods.hpp"

namespace fs = std::filesystem;
namespace pm = peft::merge;
using nlohmann::json;

namespace {

fs::path g_dir;

std::vector<unsigned char> read_bytes(const std::string& name) {
  std::ifstream in(g_dir / name, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + name);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> read_floats(const std::string& name) {
  const auto bytes = read_bytes(name);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

void write_bytes(const std::string& name, const void* data, size_t n) {
  std::ofstream out(g_dir / name, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw std::runtime_error("cannot write " + name);
}

std::vector<int64_t> shape_of(const json& j) { return j.at("shape").get<std::vector<int64_t>>(); }

pm::ModuleKind kind_of(const std::string& s) {
  if (s == "linear") return pm::ModuleKind::linear;
  if (s == "conv1d_gpt2") return pm::ModuleKind::conv1d_gpt2;
  if (s == "embedding") return pm::ModuleKind::embedding;
  if (s == "conv") return pm::ModuleKind::conv;
  throw std::runtime_error("unknown kind " + s);
}

peft::DType dtype_of(const json& j) {
  const auto d = peft::dtype_from_name(j.at("dtype").get<std::string>());
  if (!d) throw std::runtime_error("unknown dtype");
  return *d;
}

void run_merge(const json& c) {
  const pm::ModuleKind kind = kind_of(c.at("kind"));
  const json& wj = c.at("weight");
  const peft::DType dtype = dtype_of(wj);
  std::vector<unsigned char> weight = read_bytes(wj.at("file"));
  std::vector<std::vector<float>> storage;
  std::vector<pm::LoraFactors> terms;
  pm::DeltaLayout layout;
  for (const json& t : c.at("terms")) {
    storage.push_back(read_floats(t.at("a").at("file")));
    const float* a = storage.back().data();
    storage.push_back(read_floats(t.at("b").at("file")));
    const float* b = storage.back().data();
    const auto a_shape = shape_of(t.at("a")), b_shape = shape_of(t.at("b"));
    layout = pm::layout_for(kind, shape_of(wj), a_shape, b_shape, c.value("groups", 1), c.value("name", ""));
    terms.push_back({a, b, a_shape[0], t.at("coefficient").get<double>()});
  }
  const pm::WeightView view{weight.data(), dtype, layout.rows(), layout.cols()};
  std::vector<float> magnitude, norm;
  if (c.contains("magnitude")) {
    magnitude = read_floats(c["magnitude"].at("file"));
    norm = pm::dora_merge(view, layout, terms, magnitude.data());
  } else {
    pm::add_delta(view, layout, terms);
  }
  write_bytes(c.at("out_weight"), weight.data(), weight.size());
  if (c.contains("out_norm")) write_bytes(c["out_norm"], norm.data(), norm.size() * 4);

  if (c.contains("unmerge_input")) {
    std::vector<unsigned char> merged = read_bytes(c["unmerge_input"].at("file"));
    const pm::WeightView mv{merged.data(), dtype, layout.rows(), layout.cols()};
    // DoRA: the norm cached at merge time; the spec may supply the reference's own.
    if (c.contains("unmerge_norm")) norm = read_floats(c["unmerge_norm"].at("file"));
    if (!magnitude.empty())
      pm::dora_unmerge(mv, layout, terms, magnitude.data(), norm.data());
    else
      pm::subtract_delta(mv, layout, terms);
    write_bytes(c.at("out_unmerged"), merged.data(), merged.size());
  }
  if (c.contains("bias")) {
    std::vector<unsigned char> bias = read_bytes(c["bias"].at("file"));
    const auto lora_bias = read_floats(c.at("lora_bias").at("file"));
    const pm::WeightView bv{bias.data(), dtype_of(c["bias"]), 1, layout.out};
    pm::add_lora_bias(bv, lora_bias.data(), terms.at(0).coefficient);
    write_bytes(c.at("out_bias"), bias.data(), bias.size());
  }
}

void run_combine(const json& c) {
  const int64_t out = c.at("out"), in = c.at("in");
  std::vector<std::vector<float>> storage;
  std::vector<pm::WeightedFactors> adapters;
  for (const json& a : c.at("adapters")) {
    storage.push_back(read_floats(a.at("a").at("file")));
    const float* pa = storage.back().data();
    storage.push_back(read_floats(a.at("b").at("file")));
    adapters.push_back({pa, storage.back().data(), a.at("rank").get<int64_t>(), a.at("scaling").get<double>(),
                        a.at("weight").get<double>()});
  }
  const std::string method = c.at("method");
  const pm::CombinedFactors r =
      method == "cat" ? pm::combine_cat(adapters, out, in) : pm::combine_linear(adapters, out, in);
  write_bytes(c.at("out_a"), r.a.data(), r.a.size() * 4);
  write_bytes(c.at("out_b"), r.b.data(), r.b.size() * 4);
}

}  // namespace

// FourierFT's positions (torch.randperm) and delta, for test_method_merge_vera_randlora_fourierft.py.
void run_fourierft(const json& c) {
  if (c.at("op") == "randperm") {
    const auto r = pm::torch_randperm(c.at("n").get<int64_t>(), c.at("seed").get<int64_t>(), c.at("count").get<int64_t>());
    write_bytes(c.at("out").get<std::string>(), r.data(), r.size() * sizeof(int64_t));
    return;
  }
  pm::MethodTensor spectrum;
  spectrum.values = read_floats(c.at("spectrum").at("file").get<std::string>());
  spectrum.shape = {static_cast<int64_t>(spectrum.values.size())};
  const auto d = pm::fourierft_delta(spectrum, c.at("seed").get<int64_t>(), c.at("scale").get<double>(),
                                     c.at("out").get<int64_t>(), c.at("in").get<int64_t>(), "driver");
  write_bytes(c.at("out_delta").get<std::string>(), d.data(), d.size() * sizeof(float));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: merge_math_driver SPEC.json\n");
    return 2;
  }
  try {
    const fs::path spec_path(argv[1]);
    g_dir = spec_path.parent_path();
    std::ifstream in(spec_path);
    const json spec = json::parse(in);
    for (const json& c : spec.at("cases")) {
      const std::string op = c.at("op");
      if (op == "merge")
        run_merge(c);
      else if (op == "combine")
        run_combine(c);
      else if (op == "randperm" || op == "fourierft")
        run_fourierft(c);
      else
        throw std::runtime_error("unknown op " + op);
    }
  } catch (const peft::Error& e) {
    std::fprintf(stderr, "merge_math_driver: %s: %s\n", peft::code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "merge_math_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
