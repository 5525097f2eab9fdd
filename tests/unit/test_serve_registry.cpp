// The serving registry: LoadedAdapter (what a load puts in memory, compared with the checkpoint's
// values rounded as torch's .to()), and Registry / Lease (lazy loading, the byte budget, LRU
// eviction, pins, replacement while leased, removal, layer names), then many threads at once and a
// long soak. The concurrency and soak cases run under ThreadSanitizer on their own:
//   peft_unit -tc='registry concurrency*,registry soak*'
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "peft/adapter/adapter.hpp"
#include "serve/loaded_adapter.hpp"
#include "serve/registry.hpp"
#include "test_adapter_support.hpp"
#include "test_error_support.hpp"
#include "peft_test_paths.h"

using error_test::code_of;
using peft::Adapter;
using peft::AdapterModule;
using peft::AdapterTensor;
using peft::DType;
using peft::LayerKind;
using peft::TensorRole;
using peft::serve::Lease;
using peft::serve::LoadedAdapter;
using peft::serve::LoadedLayer;
using peft::serve::Registry;
using peft::serve::RegistryStats;
namespace fs = std::filesystem;

namespace {

const std::string kAdapters = std::string(PEFT_TEST_DATA) + "/adapters/";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::shared_ptr<const Adapter> open_fixture(const std::string& name) { return Adapter::open(kAdapters + name, {}); }

// A tensor for write_tensors: its values are given as doubles and stored in `dtype`.
struct TensorData {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<double> values;
};

// A safetensors file of `tensors` (F64 values converted to each tensor's dtype by the library).
std::string safetensors_bytes(const std::vector<TensorData>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const TensorData& t : tensors) {
    const uint64_t nbytes = peft::converted_byte_size(t.dtype, t.values.size());
    std::string bytes(nbytes, '\0');  // zeros for dtypes the values do not convert to
    if (peft::can_convert(DType::F64, t.dtype))
      peft::convert(DType::F64, t.values.data(), t.dtype, bytes.data(), t.values.size());
    header[t.name] = {{"dtype", std::string(peft::dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + nbytes}}};
    data += bytes;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text + data;
}

std::vector<double> ramp(size_t count, double start, double step) {
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = start + step * static_cast<double>(i);
  return out;
}

// llama_lora with every F32 value v made v + shift: a distinct adapter of the same shapes and size.
struct LlamaVariants {
  std::string config = read_file(kAdapters + "llama_lora/adapter_config.json");
  std::string weights = read_file(kAdapters + "llama_lora/adapter_model.safetensors");

  std::string shifted(float shift) const {
    std::string out = weights;
    uint64_t header = 0;
    std::memcpy(&header, out.data(), 8);
    for (size_t at = 8 + header; at + 4 <= out.size(); at += 4) {  // every tensor of llama_lora is F32
      float v;
      std::memcpy(&v, out.data() + at, 4);
      v += shift;
      std::memcpy(out.data() + at, &v, 4);
    }
    return out;
  }
  std::shared_ptr<const Adapter> open(float shift) const {
    const std::string bytes = shifted(shift);
    return Adapter::open_memory(config, bytes.data(), bytes.size(), {});
  }
};

const LlamaVariants& llama_variants() {
  static const LlamaVariants variants;
  return variants;
}

// Checks that `loaded` holds every LoRA layer of `adapter`, each tensor being the checkpoint's
// values rounded to the storage dtype (torch's .to()), and nothing else.
void check_loaded(const LoadedAdapter& loaded, const Adapter& adapter) {
  const DType storage = loaded.dtype();
  const size_t element_size = peft::dtype_bits(storage) / 8;
  uint64_t bytes = 0;
  size_t lora_modules = 0;
  for (const AdapterModule& m : adapter.modules()) {
    CAPTURE(m.name);
    const LoadedLayer* layer = loaded.find(m.name);
    if (!m.is_lora()) {
      CHECK(layer == nullptr);
      continue;
    }
    ++lora_modules;
    REQUIRE(layer != nullptr);
    CHECK(layer->module == m.name);
    CHECK(layer->kind == m.kind);
    CHECK(layer->rank == m.rank);
    CHECK(layer->scaling == m.scaling);
    auto check_tensor = [&](TensorRole role, size_t offset) {
      CAPTURE(peft::role_suffix(role));
      const AdapterTensor* t = m.find(role);
      if (t == nullptr) {
        CHECK(offset == LoadedLayer::npos);
        return;
      }
      REQUIRE(offset != LoadedLayer::npos);
      const std::vector<float> f32 = adapter.checkpoint().read_f32(t->index);
      std::vector<unsigned char> rounded(f32.size() * element_size);
      peft::convert(DType::F32, f32.data(), storage, rounded.data(), f32.size());
      CHECK(std::memcmp(loaded.data(offset), rounded.data(), rounded.size()) == 0);
      std::vector<float> expect(f32.size()), got(f32.size());
      peft::convert(storage, rounded.data(), DType::F32, expect.data(), f32.size());
      loaded.read_f32(offset, f32.size(), got.data());
      CHECK(std::memcmp(got.data(), expect.data(), got.size() * sizeof(float)) == 0);
      bytes += rounded.size();
    };
    const bool embedding = m.kind == LayerKind::embedding;
    check_tensor(embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a, layer->a);
    check_tensor(embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b, layer->b);
    check_tensor(TensorRole::lora_b_bias, layer->bias);
    check_tensor(TensorRole::lora_magnitude, layer->magnitude);
    const AdapterTensor* a = m.find(embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a);
    const AdapterTensor* b = m.find(embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b);
    const auto& a_shape = adapter.checkpoint().tensor(a->index).shape;
    const auto& b_shape = adapter.checkpoint().tensor(b->index).shape;
    CHECK(layer->a_shape == std::vector<int64_t>(a_shape.begin(), a_shape.end()));
    CHECK(layer->b_shape == std::vector<int64_t>(b_shape.begin(), b_shape.end()));
    int64_t a_cols = 1;
    for (size_t d = 1; d < a_shape.size(); ++d) a_cols *= static_cast<int64_t>(a_shape[d]);
    CHECK(layer->a_cols == a_cols);
    CHECK(layer->b_rows == static_cast<int64_t>(b_shape[0]));
  }
  CHECK(loaded.layers().size() == lora_modules);
  CHECK(loaded.bytes() == bytes);
  CHECK(LoadedAdapter::bytes_needed(adapter, storage) == bytes);
}

// Whether two loaded adapters hold the same layers and the same bytes.
bool same_contents(const LoadedAdapter& x, const LoadedAdapter& y) {
  if (x.bytes() != y.bytes() || x.dtype() != y.dtype() || x.layers().size() != y.layers().size()) return false;
  for (size_t i = 0; i < x.layers().size(); ++i) {
    const LoadedLayer& a = x.layers()[i];
    const LoadedLayer* b = y.find(a.module);
    if (!b || b->a != a.a || b->b != a.b || b->rank != a.rank || b->scaling != a.scaling) return false;
  }
  return x.bytes() == 0 || std::memcmp(x.data(0), y.data(0), x.bytes()) == 0;
}

// The invariants every stats() snapshot keeps when all versions are `size` bytes.
void check_stats(const RegistryStats& s, uint64_t size) {
  CHECK(s.loaded_bytes <= s.budget_bytes);
  CHECK(s.loaded_bytes == s.loaded * size);
  CHECK(s.pinned <= s.loaded);
  CHECK(s.peak_loaded_bytes >= s.loaded_bytes);
}

}  // namespace

TEST_CASE("loaded adapter: every LoRA kind and tensor role, converted to each storage dtype") {
  adapter_test::TempDir tmp;
  // A Conv2d layer and a Linear layer whose tensors are F64, F16 and BF16 in the file.
  const auto conv_dir = tmp.path / "conv";
  adapter_test::write_text(conv_dir / "adapter_config.json",
                           adapter_test::config_text({{"target_modules", {"conv", "proj"}}, {"lora_bias", true}}));
  {
    std::ofstream out(conv_dir / "adapter_model.safetensors", std::ios::binary);
    out << safetensors_bytes({
        {"base_model.model.conv.lora_A.weight", DType::F64, {2, 3, 3, 3}, ramp(54, -1.0, 0.0371)},
        {"base_model.model.conv.lora_B.weight", DType::F16, {5, 2, 1, 1}, ramp(10, 0.5, -0.1234)},
        {"base_model.model.conv.lora_B.bias", DType::BF16, {5}, ramp(5, 0.25, 0.3)},
        {"base_model.model.proj.lora_A.weight", DType::F32, {2, 7}, ramp(14, 1.0 / 3.0, 1e-3)},
        {"base_model.model.proj.lora_B.weight", DType::F64, {6, 2}, ramp(12, -2.0, 0.333333333333)},
        {"base_model.model.proj.lora_B.bias", DType::F32, {6}, ramp(6, 0.1, 0.1)},
    });
  }
  std::vector<std::shared_ptr<const Adapter>> adapters = {
      Adapter::open(conv_dir.string(), {}), open_fixture("llama_lora"),   open_fixture("llama_dora"),
      open_fixture("llama_embedding"),      open_fixture("qwen2_lora_bias"), open_fixture("gpt2_lora"),
      open_fixture("llama_bf16_lora"),      open_fixture("bert_seqcls_lora")};
  for (const auto& adapter : adapters) {
    for (DType storage : {DType::F32, DType::BF16, DType::F16}) {
      CAPTURE(adapter->dir());
      CAPTURE(peft::dtype_name(storage));
      const auto loaded = LoadedAdapter::load(adapter, storage);
      CHECK(loaded->dtype() == storage);
      CHECK(&loaded->adapter() == adapter.get());
      check_loaded(*loaded, *adapter);
    }
  }
  const auto conv = LoadedAdapter::load(adapters[0], DType::F32);
  const LoadedLayer* layer = conv->find("conv");
  REQUIRE(layer != nullptr);
  CHECK(layer->kind == LayerKind::conv2d);
  CHECK(layer->a_cols == 27);
  CHECK(layer->b_rows == 5);
  CHECK(conv->find("proj")->kind == LayerKind::linear);
  CHECK(LoadedAdapter::load(open_fixture("gpt2_lora"), DType::F32)->layers().front().kind == LayerKind::conv1d);
  CHECK(LoadedAdapter::load(open_fixture("llama_embedding"), DType::F32)->find("model.embed_tokens")->kind ==
        LayerKind::embedding);
  // Replacement tensors are reported, not loaded.
  CHECK(LoadedAdapter::load(open_fixture("bert_seqcls_lora"), DType::F32)->has_replacements());
  CHECK_FALSE(LoadedAdapter::load(open_fixture("llama_lora"), DType::F32)->has_replacements());
  CHECK(conv->find("model.layers.0.self_attn.q_proj") == nullptr);

  // Element ranges outside the storage are refused.
  float sink[2];
  const uint64_t elements = conv->bytes() / 4;
  CHECK(code_of([&] { conv->read_f32(elements - 1, 2, sink); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { conv->read_f32(LoadedLayer::npos, 1, sink); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { conv->data(elements + 1); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { LoadedAdapter::load(adapters[1], DType::I32); }) == PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("loaded adapter: tensors that cannot be served are refused from the header") {
  adapter_test::TempDir tmp;
  const auto dir = tmp.path / "i32";
  adapter_test::write_text(dir / "adapter_config.json", adapter_test::config_text({{"target_modules", {"proj"}}}));
  {
    std::ofstream out(dir / "adapter_model.safetensors", std::ios::binary);
    out << safetensors_bytes({{"base_model.model.proj.lora_A.weight", DType::I32, {2, 3}, ramp(6, 0, 1)},
                              {"base_model.model.proj.lora_B.weight", DType::F32, {4, 2}, ramp(8, 0, 1)}});
  }
  const auto adapter = Adapter::open(dir.string(), {});
  CHECK(code_of([&] { LoadedAdapter::bytes_needed(*adapter, DType::F32); }) == PEFT_ERR_UNSUPPORTED);
  Registry registry(DType::BF16, 1 << 20, std::nullopt);
  CHECK(code_of([&] { registry.add("i32", adapter); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(registry.names().empty());

  // A Conv2d lora_B with a kernel is not the [out, r] matrix consumers read.
  const auto kernel_dir = tmp.path / "kernel";
  adapter_test::write_text(kernel_dir / "adapter_config.json",
                           adapter_test::config_text({{"target_modules", {"conv"}}}));
  {
    std::ofstream out(kernel_dir / "adapter_model.safetensors", std::ios::binary);
    out << safetensors_bytes({{"base_model.model.conv.lora_A.weight", DType::F32, {2, 3, 1, 1}, ramp(6, 0, 1)},
                              {"base_model.model.conv.lora_B.weight", DType::F32, {4, 2, 3, 3}, ramp(72, 0, 1)}});
  }
  CHECK(code_of([&] { registry.add("kernel", Adapter::open(kernel_dir.string(), {})); }) == PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("loaded adapter: tensors saved beside a LoRA layer's factors count as replacements") {
  // bias="all" saves the adapted layer's bias as "<module>.base_layer.bias"; a swap that merged only
  // the factors would silently leave the old bias, so such an adapter must report replacements.
  adapter_test::TempDir tmp;
  const auto write = [&](const std::string& name, std::vector<TensorData> tensors) {
    const auto dir = tmp.path / name;
    adapter_test::write_text(dir / "adapter_config.json",
                             adapter_test::config_text({{"target_modules", {"proj"}}, {"bias", "all"}}));
    std::ofstream(dir / "adapter_model.safetensors", std::ios::binary) << safetensors_bytes(tensors);
    return LoadedAdapter::load(Adapter::open(dir.string(), {}), DType::F32);
  };
  const TensorData a{"base_model.model.proj.lora_A.weight", DType::F32, {2, 3}, ramp(6, 0, 1)};
  const TensorData b{"base_model.model.proj.lora_B.weight", DType::F32, {4, 2}, ramp(8, 0, 1)};
  const TensorData bias{"base_model.model.proj.base_layer.bias", DType::F32, {4}, ramp(4, 0, 1)};
  CHECK_FALSE(write("factors", {a, b})->has_replacements());
  const auto with_bias = write("with_bias", {a, b, bias});
  CHECK(with_bias->has_replacements());
  CHECK(with_bias->layers().size() == 1);
}

TEST_CASE("registry: registering reads no tensor data; the first acquire loads, later ones hit") {
  adapter_test::TempDir tmp;
  fs::copy(kAdapters + "llama_lora", tmp.path / "copy");
  const fs::path weights = tmp.path / "copy" / "adapter_model.safetensors";
  const std::string original = read_file(weights);
  uint64_t header = 0;
  std::memcpy(&header, original.data(), 8);

  Adapter::Options options;
  Registry registry(DType::BF16, 1 << 20, std::nullopt);
  registry.add("copy", Adapter::open((tmp.path / "copy").string(), options));
  RegistryStats s = registry.stats();
  CHECK(s.registered == 1);
  CHECK(s.loads == 0);
  CHECK(s.loaded_bytes == 0);

  // With its tensor data cut off the file, registration has nothing to read: the load fails then.
  fs::resize_file(weights, 8 + header);
  CHECK(code_of([&] { registry.acquire("copy"); }) == PEFT_ERR_IO);
  s = registry.stats();
  CHECK(s.loaded_bytes == 0);
  CHECK(s.pinned == 0);
  CHECK(s.loads == 0);
  // Nothing stayed reserved: the whole budget is there for the next load. A file restored in place
  // is not the file that was opened (a changed modification time fails the load too), so it is
  // registered again, as a server does after an adapter changes on disk.
  {
    std::ofstream out(weights, std::ios::binary | std::ios::trunc);
    out << original;
  }
  registry.add("copy", Adapter::open((tmp.path / "copy").string(), options));
  registry.set_budget(LoadedAdapter::bytes_needed(*open_fixture("llama_lora"), DType::BF16));
  auto lease = registry.acquire("copy");
  check_loaded(lease->loaded(), *open_fixture("llama_lora"));
  s = registry.stats();
  CHECK(s.loads == 1);
  CHECK(s.hits == 0);
  CHECK(s.loaded == 1);
  CHECK(s.pinned == 1);
  CHECK(s.loaded_bytes == lease->loaded().bytes());
  CHECK(s.peak_loaded_bytes == s.loaded_bytes);

  auto second = registry.acquire("copy");
  CHECK(second->loaded_ptr() == lease->loaded_ptr());
  CHECK(second->version() == lease->version());
  CHECK(second->name() == "copy");
  s = registry.stats();
  CHECK(s.loads == 1);
  CHECK(s.hits == 1);
  CHECK(s.pinned == 1);
  lease.reset();
  second.reset();
  s = registry.stats();
  CHECK(s.pinned == 0);
  CHECK(s.loaded == 1);  // unpinned, still in memory until evicted
  registry.trim();
  s = registry.stats();
  CHECK(s.loaded == 0);
  CHECK(s.loaded_bytes == 0);
  CHECK(s.evictions == 1);
}

TEST_CASE("registry: least recently used versions are evicted first; pinned ones never") {
  const LlamaVariants& v = llama_variants();
  const uint64_t size = LoadedAdapter::bytes_needed(*v.open(0), DType::F32);
  Registry registry(DType::F32, 3 * size + size / 2, std::nullopt);
  for (const char* name : {"a", "b", "c", "d"}) registry.add(name, v.open(static_cast<float>(name[0])));
  auto loads = [&] { return registry.stats().loads; };
  // Loaded (most recent first) after each step in the comments.
  for (const char* name : {"a", "b", "c"}) registry.acquire(name);  // c b a
  CHECK(loads() == 3);
  registry.acquire("a");  // a c b (a hit)
  CHECK(loads() == 3);
  registry.acquire("d");  // d a c: b, the least recently used, went
  CHECK(loads() == 4);
  CHECK(registry.stats().evictions == 1);
  registry.acquire("a");  // a d c
  registry.acquire("c");  // c a d
  CHECK(loads() == 4);
  registry.acquire("b");  // b c a: d went
  CHECK(loads() == 5);
  registry.acquire("a");
  registry.acquire("c");
  CHECK(loads() == 5);
  registry.acquire("d");
  CHECK(loads() == 6);
  check_stats(registry.stats(), size);

  // Pinned versions stay whatever their age; an adapter that does not fit beside them is refused.
  registry.trim();
  auto a = registry.acquire("a");
  auto b = registry.acquire("b");
  auto c = registry.acquire("c");
  RegistryStats before = registry.stats();
  CHECK(code_of([&] { registry.acquire("d"); }) == PEFT_ERR_OVER_BUDGET);
  RegistryStats after = registry.stats();
  CHECK(after.loaded_bytes == before.loaded_bytes);
  CHECK(after.loaded == 3);
  CHECK(after.pinned == 3);
  CHECK(after.loads == before.loads);
  CHECK(after.evictions == before.evictions);
  b.reset();  // b is the only unpinned one now, though a is older
  auto d = registry.acquire("d");
  after = registry.stats();
  CHECK(after.evictions == before.evictions + 1);
  CHECK(after.pinned == 3);
  a.reset();
  c.reset();
  d.reset();
  // The most recently released is the most recently used: a goes first, then c.
  registry.acquire("b");
  auto a_again = registry.acquire("a");
  CHECK(registry.stats().loads == after.loads + 2);
  CHECK(registry.acquire("d")->loaded().bytes() == size);  // d was kept
  CHECK(registry.stats().loads == after.loads + 2);
  check_stats(registry.stats(), size);

  // An adapter larger than the whole budget never fits.
  Registry tiny(DType::F32, size - 1, std::nullopt);
  tiny.add("a", v.open(1));
  CHECK(code_of([&] { tiny.acquire("a"); }) == PEFT_ERR_OVER_BUDGET);
  CHECK(tiny.stats().loaded_bytes == 0);
  CHECK(tiny.stats().pinned == 0);
}

TEST_CASE("registry: set_budget evicts down to the new budget or refuses without changing anything") {
  const LlamaVariants& v = llama_variants();
  const uint64_t size = LoadedAdapter::bytes_needed(*v.open(0), DType::BF16);
  Registry registry(DType::BF16, 4 * size, std::nullopt);
  for (const char* name : {"a", "b", "c"}) registry.add(name, v.open(static_cast<float>(name[0])));
  auto a = registry.acquire("a");
  registry.acquire("b");
  registry.acquire("c");
  CHECK(registry.stats().loaded == 3);

  CHECK(code_of([&] { registry.set_budget(size - 1); }) == PEFT_ERR_OVER_BUDGET);
  RegistryStats s = registry.stats();
  CHECK(s.budget_bytes == 4 * size);
  CHECK(s.loaded == 3);
  CHECK(s.evictions == 0);

  registry.set_budget(2 * size);  // b (least recently used) goes
  s = registry.stats();
  CHECK(s.budget_bytes == 2 * size);
  CHECK(s.loaded == 2);
  CHECK(s.evictions == 1);
  CHECK(s.loaded_bytes == 2 * size);
  registry.acquire("c");
  CHECK(registry.stats().loads == 3);  // c stayed

  registry.set_budget(size);  // only the pinned a fits
  s = registry.stats();
  CHECK(s.loaded == 1);
  CHECK(s.pinned == 1);
  CHECK(s.loaded_bytes == size);
  a.reset();
  registry.set_budget(0);
  s = registry.stats();
  CHECK(s.loaded == 0);
  CHECK(s.loaded_bytes == 0);
  CHECK(code_of([&] { registry.acquire("a"); }) == PEFT_ERR_OVER_BUDGET);
}

TEST_CASE("registry: replacing a name while it is leased") {
  const LlamaVariants& v = llama_variants();
  const auto first = v.open(1), second = v.open(2);
  const uint64_t size = LoadedAdapter::bytes_needed(*first, DType::F16);
  Registry registry(DType::F16, 3 * size, std::nullopt);
  registry.add("x", first);
  auto old_lease = registry.acquire("x");
  CHECK(old_lease->version() == 1);

  registry.add("x", second);
  CHECK(registry.names() == std::vector<std::string>{"x"});
  RegistryStats s = registry.stats();
  CHECK(s.registered == 1);
  CHECK(s.loaded == 1);  // the old version, still leased
  CHECK(s.loaded_bytes == size);
  check_loaded(old_lease->loaded(), *first);  // the old lease keeps reading the old values

  auto new_lease = registry.acquire("x");
  CHECK(new_lease->version() == 2);
  CHECK(&new_lease->loaded().adapter() == second.get());
  check_loaded(new_lease->loaded(), *second);
  CHECK_FALSE(same_contents(new_lease->loaded(), old_lease->loaded()));
  s = registry.stats();
  CHECK(s.loaded == 2);
  CHECK(s.loaded_bytes == 2 * size);

  // The old version's memory goes with its last lease (a clone is a lease too).
  auto old_clone = old_lease->clone();
  CHECK(old_clone->version() == 1);
  old_lease.reset();
  CHECK(registry.stats().loaded == 2);
  std::weak_ptr<const LoadedAdapter> old_memory = old_clone->loaded_ptr();
  old_clone.reset();
  s = registry.stats();
  CHECK(s.loaded == 1);
  CHECK(s.pinned == 1);
  CHECK(s.loaded_bytes == size);
  CHECK(s.evictions == 0);
  CHECK(old_memory.expired());

  // Replacing a loaded version that nothing pins frees it at once.
  new_lease.reset();
  CHECK(registry.stats().loaded == 1);
  registry.add("x", first);
  s = registry.stats();
  CHECK(s.loaded == 0);
  CHECK(s.loaded_bytes == 0);
  CHECK(registry.acquire("x")->version() == 3);
}

TEST_CASE("registry: unregistering, names in registration order, leases that outlive the registry") {
  const LlamaVariants& v = llama_variants();
  const uint64_t size = LoadedAdapter::bytes_needed(*v.open(0), DType::BF16);
  auto registry = std::make_unique<Registry>(DType::BF16, 3 * size, std::nullopt);
  for (const char* name : {"c", "a", "b"}) registry->add(name, v.open(static_cast<float>(name[0])));
  registry->add("a", v.open(7));  // a replacement keeps its place
  CHECK(registry->names() == std::vector<std::string>{"c", "a", "b"});

  auto a = registry->acquire("a");
  registry->acquire("b");
  registry->remove("a");
  registry->remove("b");  // loaded and unpinned: freed at once
  CHECK(registry->names() == std::vector<std::string>{"c"});
  CHECK(code_of([&] { registry->acquire("a"); }) == PEFT_ERR_NOT_FOUND);
  CHECK(code_of([&] { registry->remove("a"); }) == PEFT_ERR_NOT_FOUND);
  RegistryStats s = registry->stats();
  CHECK(s.registered == 1);
  CHECK(s.loaded == 1);
  CHECK(s.loaded_bytes == size);
  check_loaded(a->loaded(), a->loaded().adapter());
  registry->add("a", v.open(8));  // registered again: now last
  CHECK(registry->names() == std::vector<std::string>{"c", "a"});
  CHECK(registry->acquire("a")->version() > a->version());
  a.reset();
  s = registry->stats();
  CHECK(s.loaded == 1);  // the new "a"
  CHECK(s.loaded_bytes == size);

  // A lease keeps its adapter after the registry is gone; the rest is freed with the registry.
  auto c = registry->acquire("c");
  auto clone = c->clone();
  registry.reset();
  c.reset();
  check_loaded(clone->loaded(), clone->loaded().adapter());
  CHECK(clone->find_layer("model.layers.0.self_attn.q_proj") != nullptr);
  clone.reset();
}

TEST_CASE("registry: adapters from memory equal adapters from their folder") {
  for (const char* name : {"llama_lora", "llama_dora", "qwen2_lora_bias", "llama_embedding"}) {
    CAPTURE(name);
    const std::string config = read_file(kAdapters + name + "/adapter_config.json");
    const std::string weights = read_file(kAdapters + name + "/adapter_model.safetensors");
    Registry registry(DType::BF16, 1 << 24, std::nullopt);
    registry.add("folder", open_fixture(name));
    registry.add("memory", Adapter::open_memory(config, weights.data(), weights.size(), {}));
    auto folder = registry.acquire("folder");
    auto memory = registry.acquire("memory");
    CHECK(same_contents(folder->loaded(), memory->loaded()));
    CHECK(memory->loaded().adapter().dir() == std::string(peft::kMemoryAdapterDir));
    check_loaded(memory->loaded(), memory->loaded().adapter());
  }
}

TEST_CASE("registry: errors") {
  const LlamaVariants& v = llama_variants();
  Registry registry(DType::F32, 1 << 20, std::nullopt);
  registry.add("x", v.open(0));
  CHECK(code_of([&] { registry.add("", v.open(1)); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { registry.add("two\nlines", v.open(1)); }) == PEFT_ERR_INVALID_ARGUMENT);  // names() lists by line
  CHECK(code_of([&] { registry.add("y", nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { registry.acquire("nope"); }) == PEFT_ERR_NOT_FOUND);
  CHECK(code_of([&] { registry.remove("nope"); }) == PEFT_ERR_NOT_FOUND);
  CHECK(code_of([] { Registry bad(DType::I8, 1, std::nullopt); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([] { Registry bad(DType::F64, 1, std::nullopt); }) == PEFT_ERR_INVALID_ARGUMENT);

  // Bad bytes and bad configs fail at opening; the registry is unchanged.
  const std::string truncated = v.weights.substr(0, 5);
  CHECK(code_of([&] { Adapter::open_memory(v.config, truncated.data(), truncated.size(), {}); }) ==
        PEFT_ERR_HEADER_TOO_SMALL);
  std::string corrupt = v.weights;
  corrupt[9] = '!';
  CHECK(code_of([&] { Adapter::open_memory(v.config, corrupt.data(), corrupt.size(), {}); }) ==
        PEFT_ERR_INVALID_HEADER);
  CHECK(code_of([&] { Adapter::open_memory("{not json", v.weights.data(), v.weights.size(), {}); }) ==
        PEFT_ERR_INVALID_CONFIG);
  const std::string wrong_type = R"({"peft_type": "LORA", "r": "four"})";
  CHECK(code_of([&] { Adapter::open_memory(wrong_type, v.weights.data(), v.weights.size(), {}); }) ==
        PEFT_ERR_INVALID_CONFIG);
  CHECK(registry.names() == std::vector<std::string>{"x"});
  CHECK(registry.acquire("x")->version() == 1);
}

TEST_CASE("registry: layer names, with and without a translator") {
  Registry plain(DType::F32, 1 << 20, std::nullopt);
  plain.add("x", open_fixture("llama_lora"));
  auto lease = plain.acquire("x");
  const LoadedLayer* q = lease->find_layer("model.layers.0.self_attn.q_proj");
  REQUIRE(q != nullptr);
  CHECK(q->module == "model.layers.0.self_attn.q_proj");
  for (int round = 0; round < 2; ++round) {  // the second round reads the cache
    CHECK(lease->find_layer("model.layers.0.self_attn.q_proj.weight") == q);
    CHECK(lease->find_layer("base_model.model.model.layers.0.self_attn.q_proj") == q);
    CHECK(lease->find_layer("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == q);
    CHECK(lease->find_layer("model.layers.0.self_attn.q_proj.lora_A") == nullptr);
    CHECK(lease->find_layer("model.embed_tokens") == nullptr);
    CHECK(lease->find_layer("") == nullptr);
  }
  // The cache is per registry, the answer per adapter: another adapter resolves on its own.
  plain.add("rs", open_fixture("llama_rslora"));
  auto rs = plain.acquire("rs");
  CHECK(rs->find_layer("model.layers.0.mlp.up_proj.weight") == nullptr);
  CHECK(lease->find_layer("model.layers.0.mlp.up_proj.weight") != nullptr);
  CHECK(rs->find_layer("model.layers.0.self_attn.q_proj.weight") ==
        rs->loaded().find("model.layers.0.self_attn.q_proj"));

  Registry native(DType::F32, 1 << 20, peft::Translator::for_family("llama"));
  native.add("x", open_fixture("llama_lora"));
  auto host = native.acquire("x");
  for (int round = 0; round < 2; ++round) {
    const LoadedLayer* query = host->find_layer("transformer/layer_0/attention/query");
    REQUIRE(query != nullptr);
    CHECK(query->module == "model.layers.0.self_attn.q_proj");
    CHECK(host->find_layer("transformer/layer_1/mlp/down") == host->loaded().find("model.layers.1.mlp.down_proj"));
    CHECK(host->find_layer("transformer/embed_tokens") == nullptr);
    CHECK(code_of([&] { host->find_layer("no/such/layer"); }) == PEFT_ERR_UNRESOLVED_KEY);
  }
}

TEST_CASE("registry concurrency: threads acquire, release, replace, trim and change the budget at once") {
  // Ten names, each registered in turn with adapters from its own pool of variants; a budget that
  // holds about three. Every lease must read the values of the version it holds.
  const LlamaVariants& v = llama_variants();
  constexpr int kNames = 10, kVariantsPerName = 3, kThreads = 8, kOps = 3000;
  std::vector<std::shared_ptr<const Adapter>> pool;
  std::map<const Adapter*, int> name_of;  // variant -> the name it is registered under
  for (int n = 0; n < kNames; ++n)
    for (int k = 0; k < kVariantsPerName; ++k) {
      pool.push_back(v.open(static_cast<float>(n * kVariantsPerName + k)));
      name_of[pool.back().get()] = n;
    }
  // The storage each variant must have once loaded.
  std::map<const Adapter*, std::shared_ptr<const LoadedAdapter>> expected;
  for (const auto& adapter : pool) expected[adapter.get()] = LoadedAdapter::load(adapter, DType::BF16);
  const uint64_t size = expected.begin()->second->bytes();

  Registry registry(DType::BF16, 3 * size + size / 2, std::nullopt);
  auto name = [](int n) { return "adapter-" + std::to_string(n); };
  for (int n = 0; n < kNames; ++n) registry.add(name(n), pool[n * kVariantsPerName]);

  std::mutex seen_mutex;
  std::map<uint64_t, const Adapter*> version_adapter;  // every version seen, with its adapter
  std::atomic<int> failures{0}, acquired{0}, over_budget{0};
  auto check = [&](bool ok) {
    if (!ok) ++failures;
  };

  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::unique_ptr<Lease>> held;
    std::map<int, uint64_t> last_version;  // per name: versions only grow
    for (int op = 0; op < kOps; ++op) {
      const int n = static_cast<int>(rng() % kNames);
      const unsigned dice = rng() % 100;
      if (dice < 40) {
        std::unique_ptr<Lease> lease;
        const int32_t code = code_of([&] { lease = registry.acquire(name(n)); });
        if (code == PEFT_ERR_OVER_BUDGET) {
          ++over_budget;
          continue;
        }
        check(code == PEFT_OK && lease != nullptr);
        if (!lease) continue;
        ++acquired;
        const Adapter* adapter = &lease->loaded().adapter();
        check(lease->name() == name(n));
        check(name_of.at(adapter) == n);
        check(same_contents(lease->loaded(), *expected.at(adapter)));
        check(lease->version() >= last_version[n]);
        last_version[n] = lease->version();
        {
          std::lock_guard lock(seen_mutex);
          auto [it, inserted] = version_adapter.emplace(lease->version(), adapter);
          check(it->second == adapter);
        }
        check(lease->find_layer("model.layers.1.mlp.up_proj.weight") ==
              lease->loaded().find("model.layers.1.mlp.up_proj"));
        // Most leases go at once; some are kept (at most two per thread) for later releases.
        if (held.size() < 2 && rng() % 8 == 0) held.push_back(lease->clone());
        if (held.empty() && rng() % 4 == 0) held.push_back(std::move(lease));
      } else if (dice < 65) {
        if (!held.empty()) {
          const size_t i = rng() % held.size();
          check(same_contents(held[i]->loaded(), *expected.at(&held[i]->loaded().adapter())));
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        }
      } else if (dice < 75) {
        registry.add(name(n), pool[n * kVariantsPerName + static_cast<int>(rng() % kVariantsPerName)]);
      } else if (dice < 78) {
        registry.trim();
      } else if (dice < 83) {
        const uint64_t budget = (2 + rng() % 4) * size + size / 2;
        const int32_t code = code_of([&] { registry.set_budget(budget); });
        check(code == PEFT_OK || code == PEFT_ERR_OVER_BUDGET);
      } else {
        const RegistryStats s = registry.stats();
        check(s.loaded_bytes <= s.budget_bytes);
        check(s.loaded_bytes == s.loaded * size);
        check(s.pinned <= s.loaded);
        check(s.registered == kNames);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, 1000u + static_cast<unsigned>(t));
  for (auto& t : threads) t.join();

  CHECK(failures.load() == 0);
  CHECK(acquired.load() > kThreads * kOps / 10);
  MESSAGE("acquired " << acquired.load() << ", over budget " << over_budget.load());
  RegistryStats s = registry.stats();
  check_stats(s, size);
  CHECK(s.pinned == 0);
  CHECK(s.loads + s.hits == static_cast<uint64_t>(acquired.load()));
  registry.trim();
  s = registry.stats();
  CHECK(s.loaded == 0);
  CHECK(s.loaded_bytes == 0);
}

TEST_CASE("registry soak: thousands of register / acquire / release / evict cycles stay in budget") {
  const LlamaVariants& v = llama_variants();
  constexpr int kNames = 20, kVariants = 12, kCycles = 4000;
  std::vector<std::shared_ptr<const Adapter>> pool;
  for (int k = 0; k < kVariants; ++k) pool.push_back(v.open(static_cast<float>(k)));
  const uint64_t size = LoadedAdapter::bytes_needed(*pool[0], DType::F16);
  std::vector<std::weak_ptr<const LoadedAdapter>> memories;
  {
    Registry registry(DType::F16, 4 * size, std::nullopt);
    std::mt19937 rng(7);
    std::vector<std::unique_ptr<Lease>> held;
    auto name = [](int n) { return "soak-" + std::to_string(n); };
    std::set<int> registered;
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      const int n = static_cast<int>(rng() % kNames);
      registry.add(name(n), pool[rng() % kVariants]);
      registered.insert(n);
      std::unique_ptr<Lease> lease;
      const int wanted = static_cast<int>(rng() % kNames);
      const int32_t code = code_of([&] { lease = registry.acquire(name(wanted)); });
      // At most 3 leases are held and 4 adapters fit: only names never registered or removed fail.
      REQUIRE(code == (registered.count(wanted) ? PEFT_OK : PEFT_ERR_NOT_FOUND));
      if (lease) {
        if (cycle % 64 == 0) memories.push_back(lease->loaded_ptr());
        held.push_back(std::move(lease));
      }
      if (held.size() > 3 || (!held.empty() && rng() % 3 == 0))
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % held.size()));
      if (cycle % 97 == 0) registry.trim();
      if (cycle % 251 == 0 && cycle > 0) {
        registry.remove(name(n));
        registered.erase(n);
      }
      const RegistryStats s = registry.stats();
      REQUIRE(s.loaded_bytes <= s.budget_bytes);
      REQUIRE(s.loaded_bytes == s.loaded * size);
      std::set<const LoadedAdapter*> pinned;
      for (const auto& l : held) pinned.insert(&l->loaded());
      REQUIRE(s.pinned == pinned.size());
    }
    held.clear();
    registry.trim();
    const RegistryStats s = registry.stats();
    CHECK(s.loaded_bytes == 0);
    CHECK(s.loaded == 0);
    CHECK(s.pinned == 0);
    CHECK(s.loads > 100);
    CHECK(s.evictions > 100);
  }
  CHECK(memories.size() > 10);
  for (const auto& memory : memories) CHECK(memory.expired());
}
