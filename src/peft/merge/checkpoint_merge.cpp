// The streaming executor of a checkpoint merge: a writer loop on the calling thread and, when more
// than one thread is allowed, a producer thread that builds the next merged tensor meanwhile.
#include "peft/merge/checkpoint_merge.hpp"

#include <condition_variable>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/worker_pool.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/lowrank/adapter_delta.hpp"
#include "peft/merge/folder_files.hpp"
#include "peft/merge/merge_compute.hpp"
#include "peft/merge/merged_folder_writer.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {
namespace {

// Fails UNSUPPORTED before anything is written when `why` gives a reason for any term of the plan:
// "N module(s) <what>:" and one line per module with its reason.
template <class Why>
void refuse_modules(const MergePlan& plan, const std::string& what, Why why) {
  std::vector<std::string> refused;
  for (const PlannedTensor& p : plan.tensors)
    for (const LoraTerm& term : p.lora)
      if (const std::string reason = why(term); !reason.empty())
        refused.push_back("module " + peft::quoted(term.module->name) + " (" + reason + ")");
  if (refused.empty()) return;
  std::string message = std::to_string(refused.size()) + " module(s) " + what + ":";
  for (const std::string& line : refused) message += "\n  " + line;
  fail(PEFT_ERR_UNSUPPORTED, message);
}

namespace fs = std::filesystem;

// Bytes handed to the writer per call, between two progress reports.
constexpr uint64_t kChunkBytes = uint64_t{16} << 20;
// How many tensors (in writer order) the input is read ahead of the writer: the writer streams one
// while the producer builds the next, so the one after that is read meanwhile.
constexpr size_t kReadAheadTensors = 2;

class Executor {
 public:
  Executor(const MergePlan& plan, MergedFolderWriter& writer, const CheckpointMergeOptions& options)
      : plan_(plan), writer_(writer), options_(options), total_(plan.total_bytes()) {
    for (size_t pos = 0; pos < writer_.tensor_count(); ++pos) {
      const size_t d = writer_.declaration_at(pos);
      if (plan_.tensors[d].action == TensorAction::compute) compute_order_.push_back(d);
    }
    const unsigned hardware = core_count();
    const unsigned allowed = options.threads == 0 ? hardware : options.threads;
    threaded_ = allowed > 1 && !compute_order_.empty();
  }

  ~Executor() { stop_producer(); }

  void run() {
    report(0);
    if (threaded_) {
      spare_.resize(2);
      producer_ = std::thread([this] { produce(); });
    }
    for (size_t pos = 0; pos < kReadAheadTensors; ++pos) read_ahead(pos);
    for (size_t pos = 0; pos < writer_.tensor_count(); ++pos) {
      read_ahead(pos + kReadAheadTensors);
      const size_t d = writer_.declaration_at(pos);
      const PlannedTensor& p = plan_.tensors[d];
      switch (p.action) {
        case TensorAction::copy:
        case TensorAction::duplicate:
          copy_tensor(p, *plan_.base.weights, p.base_index);
          break;
        case TensorAction::replace:
          copy_tensor(p, p.replacement->adapter->adapter->checkpoint(), p.replacement->tensor->index);
          break;
        case TensorAction::compute:
          write_computed(p);
          break;
      }
    }
    stop_producer();
  }

 private:
  // Starts reading the input of the tensor at writer position `pos` (its base tensor, or the
  // adapter's replacement), so that the device reads it while earlier tensors are merged and written.
  void read_ahead(size_t pos) const {
    if (pos >= writer_.tensor_count()) return;
    const PlannedTensor& p = plan_.tensors[writer_.declaration_at(pos)];
    if (p.replacement) {
      p.replacement->adapter->adapter->checkpoint().will_need(p.replacement->tensor->index);
    } else {
      plan_.base.weights->will_need(p.base_index);
    }
  }

  void report(uint64_t done) {
    if (options_.progress && !options_.progress(done, total_))
      fail(PEFT_ERR_CANCELLED, "the merge was cancelled by its progress callback");
  }

  // Streams one tensor's bytes (`size` bytes in `src_dtype`) to the writer in chunks, with progress
  // reports; `chunk_at(offset, n)` gives the address of bytes [offset, offset + n).
  template <class ChunkAt>
  void stream(const PlannedTensor& p, DType src_dtype, uint64_t size, ChunkAt&& chunk_at) {
    writer_.begin_tensor(p.name, src_dtype);
    const uint64_t unit = src_dtype == p.out_dtype ? 1 : std::max<uint64_t>(1, dtype_bits(src_dtype) / 8);
    const uint64_t chunk = std::max<uint64_t>(unit, kChunkBytes / unit * unit);
    for (uint64_t offset = 0; offset < size;) {
      const uint64_t n = std::min(chunk, size - offset);
      writer_.write(chunk_at(offset, n), n);
      offset += n;
      const auto part = static_cast<uint64_t>(static_cast<unsigned __int128>(p.out_nbytes) * offset / size);
      report(done_ + part);
    }
    done_ += p.out_nbytes;
    if (size == 0) report(done_);
  }

  void stream_buffer(const PlannedTensor& p, const TensorBuffer& buffer) {
    stream(p, p.work_dtype, buffer.size(), [&](uint64_t offset, uint64_t) { return buffer.data() + offset; });
  }

  // A tensor copied from a checkpoint as it is (converted by the writer): read with pread chunk by
  // chunk, never through a mapping, so an input truncated meanwhile fails with PEFT_ERR_IO.
  void copy_tensor(const PlannedTensor& p, const Checkpoint& ckpt, size_t index) {
    const TensorInfo& info = ckpt.tensor(index);
    const uint64_t size = info.nbytes();
    copy_buffer_.reserve(std::min(size, kChunkBytes), "copying tensor " + peft::quoted(p.name));
    stream(p, info.dtype, size, [&](uint64_t offset, uint64_t n) {
      ckpt.read_bytes(index, offset, copy_buffer_.data(), n);
      return static_cast<const uint8_t*>(copy_buffer_.data());
    });
  }

  void write_computed(const PlannedTensor& p) {
    if (!threaded_) {
      compute_tensor(plan_, p, options_.threads, inline_buffer_);
      if (!options_.allow_nonfinite) check_finite(p, inline_buffer_);
      stream_buffer(p, inline_buffer_);
      return;
    }
    Ready item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_cv_.wait(lock, [&] { return ready_.has_value(); });
      item = std::move(*ready_);
      ready_.reset();
    }
    space_cv_.notify_all();
    if (item.error) std::rethrow_exception(item.error);
    if (&plan_.tensors[item.tensor] != &p) fail(PEFT_ERR_INTERNAL, "merged tensors came out of order");
    stream_buffer(p, item.buffer);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spare_.push_back(std::move(item.buffer));
    }
    space_cv_.notify_all();
  }

  struct Ready {
    size_t tensor = 0;
    TensorBuffer buffer;
    std::exception_ptr error;
  };

  // Builds the merged tensors in writer order, each into a spare buffer, and hands them over one at
  // a time: with two buffers, one is being written while the next is being built.
  void produce() {
    for (size_t d : compute_order_) {
      TensorBuffer buffer;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_cv_.wait(lock, [&] { return stop_ || (!spare_.empty() && !ready_.has_value()); });
        if (stop_) return;
        buffer = std::move(spare_.back());
        spare_.pop_back();
      }
      Ready item;
      item.tensor = d;
      try {
        compute_tensor(plan_, plan_.tensors[d], options_.threads, buffer);
        if (!options_.allow_nonfinite) check_finite(plan_.tensors[d], buffer);
      } catch (...) {
        item.error = std::current_exception();
      }
      item.buffer = std::move(buffer);
      const bool failed = static_cast<bool>(item.error);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_ = std::move(item);
      }
      ready_cv_.notify_all();
      if (failed) return;
    }
  }

  void stop_producer() {
    if (!producer_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_cv_.notify_all();
    producer_.join();
  }

  const MergePlan& plan_;
  MergedFolderWriter& writer_;
  const CheckpointMergeOptions& options_;
  const uint64_t total_;
  uint64_t done_ = 0;
  std::vector<size_t> compute_order_;  // tensors to build, in writer order
  bool threaded_ = false;
  TensorBuffer inline_buffer_;
  TensorBuffer copy_buffer_;  // chunks of copied tensors

  std::thread producer_;
  std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  std::optional<Ready> ready_;
  std::vector<TensorBuffer> spare_;
  bool stop_ = false;
};

void check_folders(const std::string& base_dir, const std::string& out_dir) {
  if (base_dir.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the base model folder must not be empty");
  if (out_dir.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output folder must not be empty");
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the output " + peft::quoted(out_dir) + " exists and is not a folder");
}

}  // namespace

CheckpointMergeResult merge_checkpoint(const std::string& base_dir_or_id, const std::string& out_dir,
                                       const CheckpointMergeOptions& options) {
  const std::string base_dir = resolve_model_location(base_dir_or_id);
  check_folders(base_dir, out_dir);
  refuse_output_over_merge_inputs(out_dir, base_dir, options.adapters);
  MergePlanOptions plan_options;
  plan_options.dtype = options.dtype;
  plan_options.max_shard_size = options.max_shard_size;
  plan_options.open = options.open;
  plan_options.tied_embeddings = options.tied_embeddings;
  MergePlan plan = plan_merge(base_dir, options.adapters, plan_options);
  plan.arithmetic = options.arithmetic;
  plan.allow_nonfinite = options.allow_nonfinite;
  const bool combined = options.combine && options.combine->how != merge::TaskArithmetic::linear;
  if (options.arithmetic == merge::Arithmetic::ggml) {  // plain LoRA only, refused before anything is written
    if (combined)
      fail(PEFT_ERR_INVALID_ARGUMENT, "adapters combined on their deltas are merged with PEFT's arithmetic, not ggml's");
    refuse_modules(plan, "cannot be merged with the ggml arithmetic, which is defined for plain LoRA only",
                   [](const LoraTerm& term) {
                     if (term.dora) return std::string("DoRA");
                     if (effect_of(term.module->method) != MethodEffect::lora)
                       return std::string(peft_method_name(term.module->method));
                     return std::string();
                   });
  }
  if (combined) {
    // Multiplicative methods' deltas need the base's weight, which a quantized base does not hold as floats.
    const bool float_base = plan.quantization.method == BaseQuantMethod::none;
    refuse_modules(plan, "cannot be combined on their deltas", [&](const LoraTerm& term) {
      std::string why;
      if (term.dora) return std::string("DoRA: its change rescales W + dW by a magnitude per output row, not a delta that adds");
      if (term.expert) return std::string("a stacked expert parameter");
      if (!has_module_delta(*term.adapter->adapter, *term.module, float_base, why, true)) return why;
      return std::string();
    });
    plan.combine = options.combine;
  }
  settle_bnb_sizes(plan, options.threads);
  std::vector<FolderFile> folder_files = plan_folder_files(base_dir, plan.base.config, plan.untie_embeddings ? plan.tie_config_key : std::string(), plan.dtype,
                                                           options.require_config, plan.dequantized);

  std::error_code ec;
  const bool created = !fs::exists(out_dir, ec);
  MergedFolderWriter writer(out_dir, plan, std::move(folder_files));
  try {
    writer.start();
    Executor(plan, writer, options).run();
    writer.finish();
  } catch (...) {
    writer.abort();
    if (created) fs::remove(out_dir, ec);  // only removes a folder that is still empty
    throw;
  }

  CheckpointMergeResult result;
  result.merged = plan.count(TensorAction::compute);
  result.replaced = plan.count(TensorAction::replace);
  result.copied = plan.count(TensorAction::copy);
  result.added = plan.count(TensorAction::duplicate);
  result.bytes = plan.total_bytes();
  result.files = writer.written_names();
  result.notes = plan.notes;
  result.untied_embeddings = plan.untie_embeddings;
  return result;
}

}  // namespace peft
