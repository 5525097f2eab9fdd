// HostModel: adapters from a registry swapped in and out of a host's buffers (the fixture models
// loaded as F32 and BF16), compared with the checkpoint merge and with the buffer merge
// (BufferMerge over buffer_merge_module, both tested against PEFT); exact restoration over thousands
// of swaps, the drift of arithmetic unmerges, and failures that leave the buffers as they were.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/buffer_merge/named_buffer_merge.hpp"
#include "serve/host_model.hpp"
#include "serve/registry.hpp"
#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;
using peft::DType;
using peft::serve::HostModel;
using peft::serve::Lease;
using peft::serve::Registry;
using peft::serve::SwapStats;

namespace {

using Bytes = std::vector<uint8_t>;

// Every 2-D ".weight" of a fixture model in host-owned buffers of one dtype, with the layer's bias
// when the model has one. The buffers never move: a HostModel points into them.
class HostBuffers {
 public:
  struct Tensor {
    std::string name;  // the checkpoint's weight name
    std::vector<int64_t> shape;
    Bytes weight, bias;
  };

  HostBuffers(const std::string& model_dir, DType dtype) : dtype_(dtype) {
    auto ckpt = peft::Checkpoint::open(model_dir);
    for (size_t i = 0; i < ckpt->tensor_count(); ++i) {
      const peft::TensorInfo& info = ckpt->tensor(i);
      if (info.shape.size() != 2 || !info.name.ends_with(".weight")) continue;
      Tensor t;
      t.name = info.name;
      for (uint64_t d : info.shape) t.shape.push_back(static_cast<int64_t>(d));
      t.weight = read(*ckpt, i);
      const std::string bias_name = info.name.substr(0, info.name.size() - 7) + ".bias";
      if (auto b = ckpt->find(bias_name)) t.bias = read(*ckpt, *b);
      tensors_.push_back(std::move(t));
    }
  }
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;

  DType dtype() const { return dtype_; }
  std::vector<Tensor>& tensors() { return tensors_; }
  size_t index_of(const std::string& name) const {
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].name == name) return i;
    throw std::runtime_error("no host tensor " + name);
  }
  Tensor& at(const std::string& name) { return tensors_[index_of(name)]; }

  // Gives the host model every weight (those `keep` accepts), under `rename(name)`, with biases
  // unless told otherwise.
  void add_to(
      HostModel& host, bool with_bias = true, const std::function<bool(const std::string&)>& keep = {},
      const std::function<std::string(const std::string&)>& rename = {}) {
    for (Tensor& t : tensors_) {
      if (keep && !keep(t.name)) continue;
      void* bias = with_bias && !t.bias.empty() ? t.bias.data() : nullptr;
      const int64_t bias_elements = static_cast<int64_t>(t.bias.size() / (dtype_bits(dtype_) / 8));
      host.add_weight(rename ? rename(t.name) : t.name, t.weight.data(), dtype_, t.shape, bias, dtype_, bias_elements);
    }
  }

  // Every byte of every buffer (weights then biases), to compare states.
  std::vector<Bytes> snapshot() const {
    std::vector<Bytes> out;
    for (const Tensor& t : tensors_) {
      out.push_back(t.weight);
      out.push_back(t.bias);
    }
    return out;
  }
  void restore(const std::vector<Bytes>& s) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      tensors_[i].weight = s[2 * i];  // same size: assignment keeps the allocation in place
      tensors_[i].bias = s[2 * i + 1];
    }
  }

 private:
  Bytes read(const peft::Checkpoint& ckpt, size_t i) const {
    Bytes out(peft::converted_byte_size(dtype_, peft::element_count(ckpt.tensor(i))));
    ckpt.read(i, dtype_, out.data(), out.size());
    return out;
  }

  DType dtype_;
  std::vector<Tensor> tensors_;
};

// The buffer merge of every LoRA module of an adapter into copies of the buffers (the reference a
// swap must equal): buffer_merge_module + BufferMerge::apply, as peft_merge_buffer_apply does.
std::vector<Bytes> buffer_merge(HostBuffers& host, const std::vector<Bytes>& original,
                                const std::shared_ptr<const peft::Adapter>& adapter, double weight) {
  const std::vector<Bytes> saved = host.snapshot();
  host.restore(original);
  for (const peft::AdapterModule& m : adapter->modules()) {
    HostBuffers::Tensor& t = host.at(m.name + ".weight");
    const peft::BufferMergeModule im = peft::buffer_merge_module(adapter, m, t.shape);
    peft::merge::WeightView w{t.weight.data(), host.dtype(), im.layout.rows(), im.layout.cols()};
    peft::merge::WeightView b{t.bias.data(), host.dtype(), 1, im.layout.out};
    peft::BufferMerge::apply(w, im.lora_bias ? &b : nullptr, im, {weight, false, 0});
  }
  std::vector<Bytes> merged = host.snapshot();
  host.restore(saved);
  return merged;
}

// The buffers after a checkpoint merge (peftc merge's path), in the host's layout.
std::vector<Bytes> checkpoint_merge(HostBuffers& host, const std::string& base, const std::string& adapter,
                                    double weight) {
  Scratch dir;
  merge(base, dir.path("out"), {{adapter, weight}});
  auto merged = peft::Checkpoint::open(dir.path("out"));
  std::vector<Bytes> out;
  for (const HostBuffers::Tensor& t : host.tensors()) {
    out.push_back(raw(*merged, t.name));
    out.push_back(t.bias.empty() ? Bytes{} : raw(*merged, t.name.substr(0, t.name.size() - 7) + ".bias"));
  }
  return out;
}

std::unique_ptr<Registry> registry_of(DType storage, const std::string& base,
                                      const std::vector<std::pair<std::string, std::string>>& adapters) {
  auto registry = std::make_unique<Registry>(storage, uint64_t{1} << 30, std::nullopt);
  for (const auto& [name, dir] : adapters) registry->add(name, open_adapter(adapter_dir(dir), model(base)));
  return registry;
}

int32_t error_code(const std::function<void()>& body, std::string* message = nullptr) {
  try {
    body();
  } catch (const peft::Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

// Elements (of 2-byte dtypes) that differ between two states.
size_t changed_elements(const std::vector<Bytes>& x, const std::vector<Bytes>& y) {
  size_t n = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j + 1 < x[i].size(); j += 2) n += x[i][j] != y[i][j] || x[i][j + 1] != y[i][j + 1];
  return n;
}

// Fails the swap steps a test picks (throws OUT_OF_MEMORY as an allocation would), counting the
// steps of each kind from 0.
struct FaultPlan {
  std::vector<int> fail_merges, fail_removes;
  int merges = 0, removes = 0;
};
FaultPlan g_faults;

void inject(bool merging) {
  const int step = merging ? g_faults.merges++ : g_faults.removes++;
  const std::vector<int>& failing = merging ? g_faults.fail_merges : g_faults.fail_removes;
  if (std::find(failing.begin(), failing.end(), step) != failing.end())
    peft::fail(PEFT_ERR_OUT_OF_MEMORY, merging ? "injected: merge step" : "injected: removal step");
}

struct FaultScope {
  explicit FaultScope(FaultPlan plan) {
    g_faults = std::move(plan);
    peft::serve::testing::swap_fault_hook = &inject;
  }
  ~FaultScope() { peft::serve::testing::swap_fault_hook = nullptr; }
};

}  // namespace

TEST_CASE("serve host: swapping in equals the checkpoint merge and the buffer merge; out restores bit for bit") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}});
  for (DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(peft::dtype_name(dtype));
    HostBuffers buffers(model("llama"), dtype);
    const std::vector<Bytes> original = buffers.snapshot();
    HostModel host;
    buffers.add_to(host);
    CHECK(host.weight_count() == 16);

    auto lease = registry->acquire("a");
    const SwapStats in = host.swap(lease.get(), 0.75);
    CHECK(in.layers_merged == 14);
    CHECK(in.layers_removed == 0);
    CHECK(in.saved_bytes > 0);
    CHECK(in.merge_seconds >= 0);
    REQUIRE(host.current() != nullptr);
    CHECK(host.current()->name() == "a");
    CHECK(buffers.snapshot() == buffer_merge(buffers, original, lease->loaded().adapter_ptr(), 0.75));
    if (dtype == DType::F32)
      CHECK(buffers.snapshot() == checkpoint_merge(buffers, model("llama"), adapter_dir("llama_lora"), 0.75));

    // The originals of the 14 adapted weights are kept, once, for the host model's lifetime.
    uint64_t adapted_bytes = 0;
    for (const peft::serve::LoadedLayer& layer : lease->loaded().layers())
      adapted_bytes += buffers.at(layer.module + ".weight").weight.size();
    CHECK(in.saved_bytes == adapted_bytes);
    const SwapStats out = host.swap(nullptr, 1.0);
    CHECK(out.layers_removed == 14);
    CHECK(out.layers_merged == 0);
    CHECK(out.saved_bytes == adapted_bytes);
    CHECK(host.current() == nullptr);
    CHECK(buffers.snapshot() == original);
  }
}

TEST_CASE("serve host: A to B equals B merged into the original buffers") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}, {"r", "llama_rslora"}});
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  buffers.add_to(host);
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  auto r = registry->acquire("r");
  host.swap(a.get(), 1.0);
  const SwapStats s = host.swap(b.get(), 0.5);
  CHECK(s.layers_removed == 14);
  CHECK(s.layers_merged == 14);
  CHECK(host.current()->name() == "b");
  CHECK(buffers.snapshot() == buffer_merge(buffers, original, b->loaded().adapter_ptr(), 0.5));
  // An adapter on fewer layers: the others come back to their original bytes.
  host.swap(r.get(), 2.0);
  CHECK(buffers.snapshot() == buffer_merge(buffers, original, r->loaded().adapter_ptr(), 2.0));
  CHECK(buffers.at("model.layers.0.mlp.up_proj.weight").weight == original[2 * buffers.index_of("model.layers.0.mlp.up_proj.weight")]);
  host.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);
}

TEST_CASE("serve host: plain LoRA merged from the kept originals in one pass, after DoRA, all-linear and LoRA adapters") {
  // A plain LoRA layer into a weight whose original was kept reads the original itself, so the
  // layer before it on that weight is taken out without writing the original back; DoRA layers (whose
  // norms are the weight's) and first merges start from the buffer as before. Every swap equals its
  // adapter merged into the original buffers, in any order.
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama",
                              {{"a", "llama_lora"}, {"d", "llama_dora"}, {"l", "llama_all_linear"}, {"b", "llama_lora_second"}});
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  buffers.add_to(host);
  for (const char* name : {"a", "d", "b", "l", "a", "b", "d", "d", "l", "a"}) {
    CAPTURE(name);
    auto lease = registry->acquire(name);
    host.swap(lease.get(), 0.75);
    CHECK(buffers.snapshot() == buffer_merge(buffers, original, lease->loaded().adapter_ptr(), 0.75));
  }
  host.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);
}

TEST_CASE("serve host: thousands of BF16 swaps leave no drift in exact mode; arithmetic unmerges drift") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  const std::vector<Bytes> with_a = buffer_merge(buffers, original, a->loaded().adapter_ptr(), 1.0);
  const std::vector<Bytes> with_b = buffer_merge(buffers, original, b->loaded().adapter_ptr(), 1.0);

  SUBCASE("exact") {
    HostModel host;
    buffers.add_to(host);
    size_t wrong = 0;
    for (int i = 0; i < 3000; ++i) {
      const int which = i % 3;  // a, b, none
      host.swap(which == 0 ? a.get() : which == 1 ? b.get() : nullptr, 1.0);
      wrong += buffers.snapshot() != (which == 0 ? with_a : which == 1 ? with_b : original);
    }
    CHECK(wrong == 0);
    CHECK(buffers.snapshot() == original);
  }
  SUBCASE("arithmetic (PEFT's unmerge)") {
    HostModel host;
    host.set_exact(false);
    buffers.add_to(host);
    const SwapStats first = host.swap(a.get(), 1.0);
    CHECK(first.saved_bytes == 0);
    for (int i = 0; i < 1000; ++i) {
      host.swap(b.get(), 1.0);
      host.swap(a.get(), 1.0);
    }
    host.swap(nullptr, 1.0);
    // Each unmerge rounds W + dW - dW back into BF16; the errors accumulate swap after swap. On
    // this fixture 3176 of the 4598 elements a merge changes have drifted after 2001 swaps in and out.
    const size_t drifted = changed_elements(buffers.snapshot(), original);
    INFO("drifted elements: " << drifted << " of " << changed_elements(with_a, original));
    CHECK(drifted > 0);
  }
}

TEST_CASE("serve host: the registry's storage dtype decides whether a swap equals the buffer merge bit for bit") {
  if (!fixtures_present()) return;
  HostBuffers buffers(model("llama"), DType::F32);
  const std::vector<Bytes> original = buffers.snapshot();
  auto adapter = open_adapter(adapter_dir("llama_lora"), model("llama"));
  const std::vector<Bytes> reference = buffer_merge(buffers, original, adapter, 1.0);
  std::vector<Bytes> by_storage[3];
  const DType storages[3] = {DType::F32, DType::BF16, DType::F16};
  for (int i = 0; i < 3; ++i) {
    auto registry = registry_of(storages[i], "llama", {{"a", "llama_lora"}});
    HostModel host;
    buffers.add_to(host);
    auto lease = registry->acquire("a");
    host.swap(lease.get(), 1.0);
    by_storage[i] = buffers.snapshot();
    host.swap(nullptr, 1.0);
    CHECK(buffers.snapshot() == original);
  }
  CHECK(by_storage[0] == reference);
  // Factors rounded to 16 bits change the merged F32 weights, slightly.
  for (int i = 1; i < 3; ++i) {
    CAPTURE(peft::dtype_name(storages[i]));
    CHECK(by_storage[i] != reference);
    for (size_t t = 0; t < reference.size(); t += 2) {
      std::vector<double> x(reference[t].size() / 4), y(x.size());
      for (size_t k = 0; k < x.size(); ++k) {
        float fx, fy;
        std::memcpy(&fx, by_storage[i][t].data() + 4 * k, 4);
        std::memcpy(&fy, reference[t].data() + 4 * k, 4);
        x[k] = fx;
        y[k] = fy;
      }
      CHECK(max_relative(x, y) < 1e-2);
    }
  }
}

TEST_CASE("serve host: GPT-2 Conv1D, embedding, DoRA, lora_bias and RSLoRA swaps equal the checkpoint merge") {
  if (!fixtures_present()) return;
  struct Case {
    const char* base;
    const char* adapter;
    double weight;
  };
  for (const Case& c : {Case{"gpt2", "gpt2_lora", 1.0}, Case{"llama", "llama_dora", 0.5},
                        Case{"qwen2", "qwen2_lora_bias", 1.5}, Case{"llama", "llama_rslora", 1.0},
                        Case{"llama", "llama_rank_alpha_pattern", 1.0}, Case{"qwen2", "qwen2_lora", 1.0}}) {
    CAPTURE(c.adapter);
    auto registry = registry_of(DType::F32, c.base, {{"x", c.adapter}});
    HostBuffers buffers(model(c.base), DType::F32);
    const std::vector<Bytes> original = buffers.snapshot();
    HostModel host;
    buffers.add_to(host);
    auto lease = registry->acquire("x");
    host.swap(lease.get(), c.weight);
    CHECK(buffers.snapshot() == checkpoint_merge(buffers, model(c.base), adapter_dir(c.adapter), c.weight));
    host.swap(nullptr, 1.0);
    CHECK(buffers.snapshot() == original);
  }
}

TEST_CASE("serve host: weights named by the host's own names through a translator") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}});
  const peft::Translator llama = peft::Translator::for_family("llama");
  HostBuffers native(model("llama"), DType::BF16), hf(model("llama"), DType::BF16);
  const std::vector<Bytes> original = native.snapshot();
  HostModel by_native, by_hf;
  by_native.set_translator(llama);
  native.add_to(by_native, true, {}, [&](const std::string& name) { return llama.to_native(name); });
  // HuggingFace module paths (no ".weight") and the PEFT prefix are accepted too.
  hf.add_to(by_hf, true, {}, [](const std::string& name) {
    return "base_model.model." + name.substr(0, name.size() - 7);
  });
  auto lease = registry->acquire("a");
  by_native.swap(lease.get(), 1.0);
  by_hf.swap(lease.get(), 1.0);
  CHECK(native.snapshot() != original);
  CHECK(native.snapshot() == hf.snapshot());

  HostModel late;
  native.add_to(late, true, {}, [&](const std::string& name) { return llama.to_native(name); });
  CHECK(error_code([&] { late.set_translator(llama); }) == PEFT_ERR_INVALID_ARGUMENT);
  HostModel unresolved;
  unresolved.set_translator(llama);
  Bytes buffer(16 * 16 * 2);
  const std::vector<int64_t> shape{16, 16};
  CHECK(error_code([&] { unresolved.add_weight("no/such/thing", buffer.data(), DType::BF16, shape, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_UNRESOLVED_KEY);
}

TEST_CASE("serve host: adding weights checks names, dtypes and shapes") {
  if (!fixtures_present()) return;
  HostModel host;
  Bytes buffer(16 * 16 * 4);
  const std::vector<int64_t> square{16, 16}, zero{16, 0}, one{256}, five{1, 4, 4, 16, 1},
      conv{16, 16, 1, 1};
  void* data = buffer.data();
  host.add_weight("model.layers.0.self_attn.q_proj.weight", data, DType::F32, square, nullptr, DType::F32, 0);
  // The same layer again, by its module path or with the PEFT prefix.
  CHECK(error_code([&] { host.add_weight("model.layers.0.self_attn.q_proj", data, DType::F32, square, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code([&] {
          host.add_weight("base_model.model.model.layers.0.self_attn.q_proj.weight", data, DType::F32, square, nullptr,
                          DType::F32, 0);
        }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code([&] { host.add_weight("k", data, DType::I8, square, nullptr, DType::F32, 0); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(error_code([&] { host.add_weight("k", data, DType::F32, square, data, DType::F64, 4); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(error_code([&] { host.add_weight("k", data, DType::F32, zero, nullptr, DType::F32, 0); }) == PEFT_ERR_SHAPE_MISMATCH);
  // 2 dimensions, 3 for a fused expert parameter, 4 for Conv2d.
  CHECK(error_code([&] { host.add_weight("k", data, DType::F32, one, nullptr, DType::F32, 0); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(error_code([&] { host.add_weight("k", data, DType::F32, five, nullptr, DType::F32, 0); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(error_code([&] { host.add_weight("k", nullptr, DType::F32, square, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  // The buffer of a weight again under another name: one tensor, so the same dtype and shape.
  CHECK(error_code([&] { host.add_weight("conv", data, DType::F32, conv, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code([&] { host.add_weight("k", data, DType::BF16, square, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  Bytes conv_buffer(16 * 16 * 4);
  host.add_weight("conv", conv_buffer.data(), DType::F32, conv, nullptr, DType::F32, 0);
  CHECK(host.weight_count() == 2);

  // No weights while an adapter is merged.
  auto registry = registry_of(DType::F32, "llama", {{"r", "llama_rank_alpha_pattern"}});
  HostBuffers buffers(model("llama"), DType::F32);
  HostModel merged;
  buffers.add_to(merged);
  auto lease = registry->acquire("r");
  merged.swap(lease.get(), 1.0);
  CHECK(error_code([&] { merged.add_weight("extra", data, DType::F32, square, nullptr, DType::F32, 0); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  merged.swap(nullptr, 1.0);
  merged.add_weight("extra", data, DType::F32, square, nullptr, DType::F32, 0);
}

TEST_CASE("serve host: a swap that cannot be done leaves the buffers and the current adapter as they were") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::BF16, "llama", {{"attention", "llama_rslora"}, {"all", "llama_lora"}});
  registry->add("bert", open_adapter(adapter_dir("bert_seqcls_lora"), model("bert")));
  registry->add("tokens", open_adapter(adapter_dir("llama_trainable_tokens"), model("llama")));
  registry->add("embedding", open_adapter(adapter_dir("llama_embedding"), model("llama")));  // saved base_layer
  auto attention = registry->acquire("attention");
  auto all = registry->acquire("all");
  auto bert = registry->acquire("bert");
  auto tokens = registry->acquire("tokens");
  auto embedding = registry->acquire("embedding");

  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  // Only the attention projections, and layer 1's q_proj with a shape that does not fit.
  buffers.add_to(host, true, [](const std::string& name) {
    return name.find("self_attn") != std::string::npos && name != "model.layers.1.self_attn.q_proj.weight";
  });
  Bytes odd(3 * 5 * 2);
  host.add_weight("model.layers.1.self_attn.q_proj.weight", odd.data(), DType::BF16, std::vector<int64_t>{3, 5}, nullptr,
                  DType::F32, 0);

  // Missing weights: every missing layer listed (the MLP of both layers), nothing changed.
  std::string message;
  CHECK(error_code([&] { host.swap(all.get(), 1.0); }, &message) == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(message.find("6 of the 14 layers") != std::string::npos);
  CHECK(message.find("\"model.layers.0.mlp.up_proj\"") != std::string::npos);
  CHECK(message.find("\"model.layers.1.mlp.down_proj\"") != std::string::npos);
  CHECK(buffers.snapshot() == original);
  CHECK(host.current() == nullptr);

  // A weight that does not fit.
  CHECK(error_code([&] { host.swap(attention.get(), 1.0); }, &message) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(message.find("model.layers.1.self_attn.q_proj") != std::string::npos);
  CHECK(buffers.snapshot() == original);
  CHECK(odd == Bytes(3 * 5 * 2));

  // With an adapter merged, every refused swap keeps it.
  HostModel fitting;
  HostBuffers fitting_buffers(model("llama"), DType::BF16);
  fitting_buffers.add_to(fitting, true, [](const std::string& name) { return name.find("self_attn") != std::string::npos; });
  fitting.swap(attention.get(), 1.0);
  const std::vector<Bytes> merged = fitting_buffers.snapshot();
  CHECK(merged != original);
  CHECK(error_code([&] { fitting.swap(all.get(), 1.0); }) == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(error_code([&] { fitting.swap(bert.get(), 1.0); }, &message) == PEFT_ERR_UNSUPPORTED);
  CHECK(message.find("modules_to_save") != std::string::npos);
  CHECK(error_code([&] { fitting.swap(tokens.get(), 1.0); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(error_code([&] { fitting.swap(embedding.get(), 1.0); }, &message) == PEFT_ERR_UNSUPPORTED);
  CHECK(message.find("base_layer") != std::string::npos);
  CHECK(error_code([&] { fitting.swap(attention.get(), std::numeric_limits<double>::quiet_NaN()); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code([&] { fitting.swap(nullptr, std::numeric_limits<double>::infinity()); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(fitting_buffers.snapshot() == merged);
  CHECK(fitting.current()->name() == "attention");
  fitting.swap(nullptr, 1.0);
  CHECK(fitting_buffers.snapshot() == original);
}

// A merged value that is infinite in the host's dtype is refused, in both removal modes: the exact
// mode puts the weight back from its kept copy (the merge saves no rows), the arithmetic mode from
// the rows the merge saved. One weight holds the largest BF16 value, so B's change overflows there.
TEST_CASE("serve host: a swap that would write an infinity is refused NON_FINITE, the buffers kept") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  for (bool exact : {true, false}) {
    CAPTURE(exact);
    HostBuffers buffers(model("llama"), DType::BF16);
    const std::string overflowing = b->loaded().layers().back().module + ".weight";
    Bytes& largest = buffers.at(overflowing).weight;
    for (size_t i = 0; i + 1 < largest.size(); i += 2) largest[i] = largest[i + 1] = 0x7F;  // 0x7F7F: 3.39e38
    const std::vector<Bytes> original = buffers.snapshot();
    HostModel host;
    host.set_exact(exact);
    buffers.add_to(host);

    // The refused layer is put back bit for bit in both modes; the layers merged before it are
    // taken out again, bit for bit in exact mode, up to last bits in arithmetic mode (as documented).
    const Bytes largest_before = largest;
    std::string message;
    CHECK(error_code([&] { host.swap(b.get(), 1e37); }, &message) == PEFT_ERR_NON_FINITE);
    CHECK(message.find(overflowing) != std::string::npos);
    CHECK(buffers.at(overflowing).weight == largest_before);
    if (exact) CHECK(buffers.snapshot() == original);
    CHECK(host.current() == nullptr);

    host.swap(a.get(), 1.0);
    const std::vector<Bytes> with_a = buffers.snapshot();
    CHECK(error_code([&] { host.swap(b.get(), 1e37); }) == PEFT_ERR_NON_FINITE);
    CHECK(host.current()->name() == "a");
    CHECK(buffers.at(overflowing).weight == with_a[2 * buffers.index_of(overflowing)]);
    if (exact) CHECK(buffers.snapshot() == with_a);  // (arithmetic: A merged again, last bits may drift)
    host.swap(nullptr, 1.0);
    if (exact) CHECK(buffers.snapshot() == original);
  }
}

TEST_CASE("serve host: lora_bias needs the layer's bias buffer") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "qwen2", {{"bias", "qwen2_lora_bias"}, {"plain", "qwen2_lora"}});
  auto bias = registry->acquire("bias");
  auto plain = registry->acquire("plain");
  HostBuffers buffers(model("qwen2"), DType::BF16);
  HostModel host;
  buffers.add_to(host, false);
  host.swap(plain.get(), 1.0);
  const std::vector<Bytes> merged = buffers.snapshot();
  std::string message;
  CHECK(error_code([&] { host.swap(bias.get(), 1.0); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("lora_B.bias") != std::string::npos);
  CHECK(buffers.snapshot() == merged);
  CHECK(host.current()->name() == "plain");
}

TEST_CASE("serve host: an exact removal writes the original bytes back, whatever the buffers hold") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  const std::vector<Bytes> with_b = buffer_merge(buffers, original, b->loaded().adapter_ptr(), 1.0);
  HostModel host;
  buffers.add_to(host);
  const uint64_t kept = host.swap(a.get(), 1.0).saved_bytes;
  // Someone writes into a merged buffer (the host must not): the next swap overwrites it.
  Bytes& poked = buffers.at(a->loaded().layers().front().module + ".weight").weight;
  poked[0] ^= 0x01;
  poked[poked.size() - 1] ^= 0x80;
  const SwapStats s = host.swap(b.get(), 1.0);
  CHECK(s.layers_removed == 14);
  CHECK(s.saved_bytes == kept);  // the originals were taken once
  CHECK(buffers.snapshot() == with_b);
  host.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);
}

TEST_CASE("serve host: switching between exact and arithmetic removal between swaps") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  const std::vector<Bytes> with_a = buffer_merge(buffers, original, a->loaded().adapter_ptr(), 1.0);
  const std::vector<Bytes> with_b = buffer_merge(buffers, original, b->loaded().adapter_ptr(), 1.0);

  SUBCASE("exact first: the originals taken then stay the reference") {
    HostModel host;
    buffers.add_to(host);
    const uint64_t kept = host.swap(a.get(), 1.0).saved_bytes;
    host.set_exact(false);
    // a was merged exactly: it comes out exactly, whatever the mode is now; b goes in arithmetically.
    CHECK(host.swap(b.get(), 1.0).saved_bytes == kept);
    CHECK(buffers.snapshot() == with_b);
    for (int i = 0; i < 20; ++i) {
      host.swap(a.get(), 1.0);
      host.swap(b.get(), 1.0);
    }
    host.swap(a.get(), 1.0);
    CHECK(buffers.snapshot() != with_a);  // arithmetic unmerges of b left last-bit differences
    host.set_exact(true);
    // a comes out arithmetically; the originals are written back before b goes in.
    CHECK(host.swap(b.get(), 1.0).saved_bytes == kept);
    CHECK(buffers.snapshot() == with_b);
    host.swap(nullptr, 1.0);
    CHECK(buffers.snapshot() == original);

    // A failed exact swap over an arithmetic merge: b's layers come out exactly and a goes back
    // in, arithmetically, over the originals.
    host.set_exact(false);
    host.swap(b.get(), 1.0);
    host.swap(a.get(), 1.0);
    host.set_exact(true);
    {
      FaultScope faults({.fail_merges = {5}, .fail_removes = {}});
      CHECK(error_code([&] { host.swap(b.get(), 1.0); }) == PEFT_ERR_OUT_OF_MEMORY);
    }
    CHECK(host.current()->name() == "a");
    // The undo merged a back arithmetically: last bits may differ, as after any arithmetic swap.
    CHECK(changed_elements(buffers.snapshot(), with_a) < changed_elements(with_a, original) / 4);
    host.swap(nullptr, 1.0);  // arithmetically
    host.swap(b.get(), 1.0);  // exactly, from the originals
    CHECK(buffers.snapshot() == with_b);
    host.swap(nullptr, 1.0);
    CHECK(buffers.snapshot() == original);
  }

  SUBCASE("arithmetic first: the originals are what the arithmetic unmerges left") {
    // The same arithmetic swaps on a second copy give what the buffers hold before the first exact merge.
    HostBuffers reference(model("llama"), DType::BF16);
    HostModel host, arithmetic;
    host.set_exact(false);
    arithmetic.set_exact(false);
    buffers.add_to(host);
    reference.add_to(arithmetic);
    for (HostModel* h : {&host, &arithmetic}) {
      for (int i = 0; i < 20; ++i) {
        CHECK(h->swap(a.get(), 1.0).saved_bytes == 0);
        h->swap(b.get(), 1.0);
      }
      h->swap(a.get(), 1.0);
    }
    arithmetic.swap(nullptr, 1.0);
    const std::vector<Bytes> drifted = reference.snapshot();
    CHECK(drifted != original);
    host.set_exact(true);
    const SwapStats s = host.swap(b.get(), 1.0);  // a out arithmetically, then the originals taken
    CHECK(s.saved_bytes > 0);
    CHECK(buffers.snapshot() == buffer_merge(buffers, drifted, b->loaded().adapter_ptr(), 1.0));
    host.swap(nullptr, 1.0);
    CHECK(buffers.snapshot() == drifted);
  }
}

TEST_CASE("serve host: an adapter with two layers on one weight is refused") {
  // Layers "proj" and "proj.weight" (both F32 [2, 2] factors) both stand for the weight "proj.weight".
  std::string header = "{", data;
  for (const char* tensor : {"proj.lora_A.weight", "proj.lora_B.weight", "proj.weight.lora_A.weight",
                             "proj.weight.lora_B.weight"}) {
    const float values[4] = {0.5f, -0.25f, 0.125f, 1.0f};
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(values), sizeof values);
    header += std::string(header.size() > 1 ? "," : "") + "\"base_model.model." + tensor +
              "\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(data.size()) + "]}";
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header + data;
  const auto adapter = peft::Adapter::open_memory(
      R"({"peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["proj", "weight"]})", file.data(),
      file.size(), {});
  Registry registry(DType::F32, 1 << 20, std::nullopt);
  registry.add("twice", adapter);
  auto lease = registry.acquire("twice");
  REQUIRE(lease->loaded().layers().size() == 2);

  std::vector<float> weight{1, 2, 3, 4};
  const std::vector<float> before = weight;
  HostModel host;
  host.add_weight("proj.weight", weight.data(), DType::F32, std::vector<int64_t>{2, 2}, nullptr, DType::F32, 0);
  std::string message;
  CHECK(error_code([&] { host.swap(lease.get(), 1.0); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("\"proj\" and \"proj.weight\" are both merged into weight \"proj.weight\"") != std::string::npos);
  CHECK(weight == before);
  CHECK(host.current() == nullptr);
}

TEST_CASE("serve host: a failure midway (injected) undoes the swap and merges the previous adapter back") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::BF16, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  for (bool exact : {true, false}) {
    CAPTURE(exact);
    HostBuffers buffers(model("llama"), DType::BF16);
    const std::vector<Bytes> original = buffers.snapshot();
    HostModel host;
    host.set_exact(exact);
    buffers.add_to(host);
    host.swap(a.get(), 1.0);
    const std::vector<Bytes> with_a = buffers.snapshot();

    // The 6th layer of b fails to merge: b's 5 come out, a's 14 go back.
    {
      FaultScope faults({.fail_merges = {5}, .fail_removes = {}});
      std::string message;
      CHECK(error_code([&] { host.swap(b.get(), 1.0); }, &message) == PEFT_ERR_OUT_OF_MEMORY);
      CHECK(message == "injected: merge step");
      CHECK(g_faults.merges == 5 + 1 + 14);
      CHECK(g_faults.removes == 14 + 5);
    }
    // The 9th removal of a fails: the 8 taken out go back.
    {
      FaultScope faults({.fail_merges = {}, .fail_removes = {8}});
      CHECK(error_code([&] { host.swap(nullptr, 1.0); }) == PEFT_ERR_OUT_OF_MEMORY);
      CHECK(g_faults.merges == 8);
    }
    CHECK(host.current()->name() == "a");
    CHECK(host.merged_layers() == 14);
    if (exact) {
      CHECK(buffers.snapshot() == with_a);
    } else {
      // The undo is itself an arithmetic unmerge and re-merge: last bits may differ, as after
      // swapping away and back.
      CHECK(changed_elements(buffers.snapshot(), with_a) < changed_elements(with_a, original) / 4);
    }
    host.swap(nullptr, 1.0);
    if (exact) CHECK(buffers.snapshot() == original);
  }
}

TEST_CASE("serve host: when undoing fails too, the host model knows what is merged and the next swap clears it") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "llama", {{"a", "llama_lora"}, {"b", "llama_lora_second"}});
  auto a = registry->acquire("a");
  auto b = registry->acquire("b");
  HostBuffers buffers(model("llama"), DType::BF16);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  buffers.add_to(host);
  host.swap(a.get(), 1.0);
  {
    // b's 4th merge fails, and so does putting back a's 3rd layer (3 merges of b, one failed,
    // 3 removals of b, 2 merges of a): 2 of a's layers end merged.
    FaultScope faults({.fail_merges = {3, 3 + 1 + 2}, .fail_removes = {}});
    std::string message;
    CHECK(error_code([&] { host.swap(b.get(), 1.0); }, &message) == PEFT_ERR_OUT_OF_MEMORY);
    CHECK(message.find("putting the previous adapter back failed too") != std::string::npos);
    CHECK(message.find("2 layers are merged") != std::string::npos);
  }
  CHECK(host.current() == nullptr);
  CHECK(host.merged_layers() == 2);
  CHECK(buffers.snapshot() != original);
  const SwapStats s = host.swap(nullptr, 1.0);
  CHECK(s.layers_removed == 2);
  CHECK(buffers.snapshot() == original);
}

TEST_CASE("serve host: the merged adapter stays pinned in its registry until swapped out") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::BF16, "llama", {{"a", "llama_lora"}});
  HostBuffers buffers(model("llama"), DType::F32);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  buffers.add_to(host);
  {
    auto lease = registry->acquire("a");
    host.swap(lease.get(), 1.0);
  }
  CHECK(registry->stats().pinned == 1);
  registry->trim();
  CHECK(registry->stats().loaded == 1);
  // Replaced and unregistered: the host model still holds its version and takes it out exactly.
  registry->add("a", open_adapter(adapter_dir("llama_lora_second"), model("llama")));
  registry->remove("a");
  CHECK(host.current()->version() == 1);
  host.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);
  CHECK(registry->stats().pinned == 0);
  CHECK(registry->stats().loaded == 0);

  // Freeing a host model releases its pin without touching the buffers.
  registry->add("b", open_adapter(adapter_dir("llama_lora"), model("llama")));
  auto freed = std::make_unique<HostModel>();
  buffers.add_to(*freed);
  freed->swap(registry->acquire("b").get(), 1.0);
  const std::vector<Bytes> merged = buffers.snapshot();
  CHECK(registry->stats().pinned == 1);
  freed.reset();
  CHECK(registry->stats().pinned == 0);
  CHECK(buffers.snapshot() == merged);
}

TEST_CASE("serve host: LoRA on stacked expert parameters swaps into the per-expert tensors as the checkpoint merge writes them, also by the host's own names") {
  if (!fixtures_present()) return;
  auto registry = registry_of(DType::F32, "mixtral", {{"a", "mixtral_target_parameters"}});
  auto lease = registry->acquire("a");
  const peft::serve::LoadedAdapter& loaded = lease->loaded();
  REQUIRE(loaded.expert_modules().size() == 4);  // gate_up_proj and down_proj of 2 layers
  // The expert factors are neither loaded nor charged: the budget counts q_proj's factors only.
  uint64_t q_elements = 0;
  for (const peft::serve::LoadedLayer& layer : loaded.layers()) q_elements += layer.rank * (layer.a_cols + layer.b_rows);
  CHECK(loaded.bytes() == 4 * q_elements);
  // Each expert's saved tensors are layers of the swap, and names of the module for lookups.
  size_t parts = 0;
  for (const peft::AdapterModule* m : loaded.expert_modules())
    parts += peft::per_expert_parts(*m, peft::expert_factor_shape(*m, loaded.adapter().checkpoint())).size();
  CHECK(parts == 2 * 2 * 3);  // 2 layers x 2 experts x (w1, w3, w2)
  const peft::AdapterModule* w3 = loaded.find_expert_module("model.layers.1.block_sparse_moe.experts.1.w3");
  REQUIRE(w3 != nullptr);
  CHECK(w3->expert->param == "gate_up_proj");
  CHECK(w3->name.starts_with("model.layers.1."));
  CHECK(loaded.find_expert_module("model.layers.1.mlp.experts.down_proj") != nullptr);
  CHECK(loaded.find_expert_module("model.layers.1.self_attn.q_proj") == nullptr);
  std::string message;
  CHECK(error_code([&] { lease->find_layer("model.layers.0.block_sparse_moe.experts.0.w1.weight"); }, &message) ==
        PEFT_ERR_UNSUPPORTED);
  CHECK(message.find("target_parameters") != std::string::npos);

  HostBuffers buffers(model("mixtral"), DType::F32);
  const std::vector<Bytes> original = buffers.snapshot();
  HostModel host;
  buffers.add_to(host);
  const SwapStats in = host.swap(lease.get(), 1.0);
  CHECK(in.layers_merged == loaded.layers().size() + parts);
  CHECK(buffers.snapshot() ==
        checkpoint_merge(buffers, model("mixtral"), adapter_dir("mixtral_target_parameters"), 1.0));
  host.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);

  // Without every per-expert tensor the swap names the missing ones, the buffers unchanged.
  HostModel partial;
  buffers.add_to(partial, true, [](const std::string& name) { return name.find(".experts.1.w2.") == std::string::npos; });
  CHECK(error_code([&] { partial.swap(lease.get(), 1.0); }, &message) == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(message.find("\"model.layers.0.block_sparse_moe.experts.1.w2\"") != std::string::npos);
  CHECK(buffers.snapshot() == original);

  // A plain LoRA layer's weight given with 3 dimensions does not fit it.
  HostModel three_d;
  HostBuffers::Tensor& q = buffers.at("model.layers.0.self_attn.q_proj.weight");
  const std::vector<int64_t> stacked{1, q.shape[0], q.shape[1]};
  three_d.add_weight(q.name, q.weight.data(), DType::F32, stacked, nullptr, DType::F32, 0);
  buffers.add_to(three_d, true, [&](const std::string& name) { return name != q.name; });
  CHECK(error_code([&] { three_d.swap(lease.get(), 1.0); }, &message) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(buffers.snapshot() == original);

  // Through a translator of the host's own names: the per-expert tensors by those names, the same bytes.
  const peft::Translator mixtral = peft::Translator::for_family("mixtral");
  CHECK(mixtral.to_native("model.layers.0.block_sparse_moe.experts.1.w3.weight") ==
        "transformer/layer_0/moe/expert_1/up/weight");
  auto adapted = [](const std::string& name) {
    return name.find("q_proj") != std::string::npos || name.find(".experts.") != std::string::npos;
  };
  HostModel translated;
  translated.set_translator(mixtral);
  buffers.add_to(translated, true, adapted, [&](const std::string& name) { return mixtral.to_native(name); });
  HostModel by_hf;
  HostBuffers hf(model("mixtral"), DType::F32);
  hf.add_to(by_hf, true, adapted);
  translated.swap(lease.get(), 1.0);
  by_hf.swap(lease.get(), 1.0);
  CHECK(buffers.snapshot() != original);
  CHECK(buffers.snapshot() == hf.snapshot());
  translated.swap(nullptr, 1.0);
  CHECK(buffers.snapshot() == original);

  // The buffer merge of one per-expert tensor by its native name: the same bytes as the swap.
  const std::string up_name = "model.layers.1.block_sparse_moe.experts.1.w3.weight";
  peft::NamedBufferMergeOptions by_native;
  by_native.translator = mixtral;
  by_native.keep_original_rows = true;
  HostBuffers::Tensor& up = buffers.at(up_name);
  peft::NamedBufferMerge merged = peft::NamedBufferMerge::apply(loaded.adapter_ptr(), mixtral.to_native(up_name),
                                                                up.weight.data(), DType::F32, up.shape, nullptr,
                                                                DType::F32, by_native);
  CHECK(up.weight == hf.at(up_name).weight);
  merged.remove(up.weight.data(), nullptr);
  CHECK(buffers.snapshot() == original);
}
