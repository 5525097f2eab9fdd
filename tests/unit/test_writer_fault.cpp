// Fault injection: a full disk (injected, and a real 64 KiB tmpfs when mounting is allowed), failing
// flushes and renames, and a process killed mid-write. After each, the target holds its old bytes
// and no temporary is left (except after SIGKILL, where a recognisable stray temporary may remain).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/sharded_writer.hpp"
#include "safetensors/writer.hpp"
#include "test_writer_support.hpp"

using namespace peft;
using writer_test::HookScope;
using writer_test::ScratchDir;

namespace {

int32_t error_code_of(const std::function<void()>& body, std::string* message = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

// Writes three 1 MiB tensors of the byte `fill` to `writer`, declared by the caller.
void stream_all(TensorWriter& writer, uint8_t fill) {
  writer.start();
  std::vector<uint8_t> chunk(64 << 10, fill);
  for (size_t p = 0; p < writer.tensor_count(); ++p) {
    const TensorDecl& t = writer.tensor_at(p);
    writer.begin_tensor(t.name, t.dtype);
    for (uint64_t done = 0; done < t.nbytes; done += chunk.size()) {
      writer.write(chunk.data(), std::min<uint64_t>(chunk.size(), t.nbytes - done));
    }
  }
  writer.finish();
}

void declare_three(TensorWriter& writer) {
  for (const char* name : {"a", "b", "c"}) writer.add_tensor(name, DType::U8, {1u << 20});
}

}  // namespace

TEST_CASE("writer fault: each failing system call keeps the old file and removes the temporary") {
  struct Case {
    testing::FileOp op;
    int error;
    int countdown;
    const char* reason;
  };
  const Case cases[] = {
      {testing::FileOp::create, EACCES, 1, "Permission denied"},
      {testing::FileOp::reserve, ENOSPC, 1, "No space left"},
      {testing::FileOp::write, ENOSPC, 1, "No space left"},
      {testing::FileOp::write, ENOSPC, 2, "No space left"},
      {testing::FileOp::write, EIO, 3, "Input/output error"},
      {testing::FileOp::fsync, EIO, 1, "Input/output error"},
      {testing::FileOp::rename, EXDEV, 1, "cross-device"},
  };
  for (const Case& c : cases) {
    CAPTURE(static_cast<int>(c.op));
    CAPTURE(c.countdown);
    ScratchDir dir;
    const std::string path = dir.path("model.safetensors");
    writer_test::write_file(path, "the old file");
    FileWriter writer(path);
    declare_three(writer);
    std::string message;
    {
      HookScope hook(c.op, c.error, c.countdown);
      CHECK(error_code_of([&] { stream_all(writer, 7); }, &message) == PEFT_ERR_IO);
    }
    CHECK(message.find("model.safetensors") != std::string::npos);
    CHECK(message.find(c.reason) != std::string::npos);
    CHECK(writer.failed());
    CHECK(writer_test::read_file(path) == "the old file");
    CHECK(writer_test::entries(dir.path()) == std::vector<std::string>{"model.safetensors"});
  }
}

TEST_CASE("writer fault: a failing shard or index keeps the old checkpoint folder whole") {
  const testing::FileOp ops[] = {testing::FileOp::write, testing::FileOp::fsync, testing::FileOp::rename};
  for (const testing::FileOp op : ops) {
    for (int countdown : {1, 2, 3, 4}) {
      CAPTURE(static_cast<int>(op));
      CAPTURE(countdown);
      ScratchDir dir;
      {  // the old layout: two shards and an index
        ShardedWriter old(dir.path(), 1u << 20);
        for (const char* name : {"x", "y"}) old.add_tensor(name, DType::U8, {1u << 20});
        stream_all(old, 1);
      }
      const auto before = writer_test::entries(dir.path());
      REQUIRE(before.size() == 3);
      std::vector<std::string> old_bytes;
      for (const auto& name : before) old_bytes.push_back(writer_test::read_file(dir.path(name)));
      ShardedWriter writer(dir.path(), 1u << 20);
      declare_three(writer);
      int32_t code;
      {
        // Renames: the three shards (to free names) come first, the index last, the commit point;
        // a failure at any of them removes the new shards again.
        HookScope hook(op, EIO, countdown);
        code = error_code_of([&] { stream_all(writer, 9); });
      }
      CHECK(code == PEFT_ERR_IO);
      CHECK(writer_test::entries(dir.path()) == before);
      for (size_t k = 0; k < before.size(); ++k) CHECK(writer_test::read_file(dir.path(before[k])) == old_bytes[k]);
    }
  }
}

TEST_CASE("writer fault: a real full disk (64 KiB tmpfs)") {
  ScratchDir dir;
  const std::string mount_point = dir.path("tmpfs");
  std::filesystem::create_directory(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=64k") != 0) {
    MESSAGE("skipped: cannot mount a tmpfs here (" << std::strerror(errno) << "); needs root or CAP_SYS_ADMIN");
    return;
  }
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{mount_point};
  const std::string path = mount_point + "/model.safetensors";
  writer_test::write_file(path, "the old file");
  {
    FileWriter writer(path);
    declare_three(writer);  // 3 MiB into 64 KiB
    std::string message;
    CHECK(error_code_of([&] { stream_all(writer, 5); }, &message) == PEFT_ERR_IO);
    CHECK(message.find("No space left") != std::string::npos);
  }
  CHECK(writer_test::read_file(path) == "the old file");
  CHECK(writer_test::entries(mount_point) == std::vector<std::string>{"model.safetensors"});
  {  // And a file that fits is written fine afterwards.
    FileWriter writer(path);
    writer.add_tensor("small", DType::U8, {1000});
    stream_all(writer, 5);
  }
  CHECK(Checkpoint::open(path)->tensor_count() == 1);
}

TEST_CASE("writer fault: a process killed mid-write leaves the target untouched") {
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    ScratchDir dir;
    const std::string target = sharded ? dir.path() + "/model.safetensors" : dir.path("model.safetensors");
    writer_test::write_file(target, "the old file");
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The child streams until its second chunk, tells the parent, and waits to be killed.
      ::close(ready[0]);
      try {
        std::unique_ptr<TensorWriter> writer;
        if (sharded) {
          writer = std::make_unique<ShardedWriter>(dir.path(), 0);
        } else {
          writer = std::make_unique<FileWriter>(target);
        }
        writer->add_tensor("t", DType::U8, {64u << 20});
        writer->write_from("t", DType::U8, [&](uint64_t offset, void* dst, uint64_t nbytes) {
          std::memset(dst, 3, nbytes);
          if (offset > 0) {
            const char byte = 1;
            (void)!::write(ready[1], &byte, 1);
            for (;;) ::pause();
          }
          return true;
        });
      } catch (...) {
      }
      ::_exit(3);
    }
    ::close(ready[1]);
    char byte = 0;
    REQUIRE(::read(ready[0], &byte, 1) == 1);
    ::close(ready[0]);
    // The temporary exists and already holds data.
    const auto temps = writer_test::temporaries(dir.path());
    REQUIRE(temps.size() == 1);
    CHECK(temps[0].rfind(".model.safetensors.peft-tmp-", 0) == 0);
    REQUIRE(::kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(writer_test::read_file(target) == "the old file");
  }
}

TEST_CASE("writer fault: temporary names are recognisable and unique") {
  ScratchDir dir;
  AtomicFile a(dir.path("f.bin"));
  AtomicFile b(dir.path("f.bin"));
  CHECK(a.temp_path() != b.temp_path());
  const std::string name = a.temp_path().substr(a.temp_path().rfind('/') + 1);
  CHECK(is_atomic_temp_name(name));
  CHECK_FALSE(is_atomic_temp_name("f.bin"));
  CHECK_FALSE(is_atomic_temp_name("model.safetensors"));
  // A very long target name still gives a temporary name the file system accepts.
  const std::string long_name(250, 'n');
  AtomicFile c(dir.path(long_name));
  c.write("x", 1);
  c.commit();
  CHECK(writer_test::read_file(dir.path(long_name)) == "x");
  a.abort();
  b.abort();
  CHECK(writer_test::entries(dir.path()) == std::vector<std::string>{long_name});
}

namespace {

// The model a reader finds in `folder`, as "name=fill,..." (every tensor is one repeated byte), or
// "none" when it finds none it can load. peftc opens the index first; transformers
// (modeling_utils._get_resolved_checkpoint_files) opens model.safetensors first when it exists.
std::string model_seen(const std::string& folder, bool transformers_order) {
  try {
    std::string path = folder;
    struct stat st;
    if (transformers_order && ::stat((folder + "/model.safetensors").c_str(), &st) == 0) path += "/model.safetensors";
    const auto ckpt = Checkpoint::open(path);
    std::string seen;
    for (size_t i = 0; i < ckpt->tensor_count(); ++i) {
      const auto bytes = ckpt->view(i);
      const bool uniform = std::all_of(bytes.begin(), bytes.end(), [&](uint8_t b) { return b == bytes[0]; });
      seen += ckpt->tensor(i).name + "=" + (uniform ? std::to_string(bytes[0]) : "mixed") + ",";
    }
    return seen;
  } catch (const Error&) {
    return "none";
  }
}

// Writes `names` (1 MiB each, byte `fill`) into `folder`: one file, or one shard per tensor.
void write_model(const std::string& folder, const std::vector<std::string>& names, bool sharded, uint8_t fill) {
  ShardedWriter writer(folder, sharded ? 1u << 20 : 0);
  for (const std::string& name : names) writer.add_tensor(name, DType::U8, {1u << 20});
  stream_all(writer, fill);
}

std::string expected_seen(const std::vector<std::string>& names, uint8_t fill) {
  std::string seen;
  for (const std::string& name : names) seen += name + "=" + std::to_string(fill) + ",";
  return seen;
}

int g_kill_at = 0;  // the rename/remove step at which the child kills itself
int g_steps = 0;
int kill_at_step(testing::FileOp op, const std::string&) {
  if ((op == testing::FileOp::rename || op == testing::FileOp::remove) && ++g_steps == g_kill_at) ::raise(SIGKILL);
  return 0;
}

}  // namespace

TEST_CASE("writer fault: a process killed at each rename or removal of a folder write leaves one model") {
  struct Layout {
    std::vector<std::string> names;
    bool sharded;
  };
  const Layout olds[] = {{{"x", "y"}, false}, {{"x", "y"}, true}, {{"x", "y", "z"}, true}};
  const Layout news[] = {{{"a", "b", "c"}, false}, {{"a", "b", "c"}, true}};
  for (const Layout& before : olds) {
    for (const Layout& after : news) {
      const std::string old_model = expected_seen(before.names, 1), new_model = expected_seen(after.names, 9);
      bool completed = false;
      int steps_killed = 0, no_model = 0;
      for (int step = 1; !completed && step < 100; ++step) {
        CAPTURE(before.sharded);
        CAPTURE(before.names.size());
        CAPTURE(after.sharded);
        CAPTURE(step);
        ScratchDir dir;
        write_model(dir.path(), before.names, before.sharded, 1);
        REQUIRE(model_seen(dir.path(), false) == old_model);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
          g_kill_at = step;
          g_steps = 0;
          testing::fault_hook = &kill_at_step;
          try {
            write_model(dir.path(), after.names, after.sharded, 9);
          } catch (...) {
            ::_exit(3);
          }
          ::_exit(0);
        }
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        if (WIFEXITED(status)) {
          REQUIRE(WEXITSTATUS(status) == 0);
          completed = true;
        } else {
          REQUIRE(WIFSIGNALED(status));
          ++steps_killed;
        }
        // Both readers see the same model, the old or the new one.
        const std::string peftc = model_seen(dir.path(), false);
        CHECK(peftc == model_seen(dir.path(), true));
        CHECK((peftc == old_model || peftc == new_model || peftc == "none"));
        if (peftc == "none") ++no_model;
        if (completed) CHECK(peftc == new_model);
        // The next write into the folder leaves no temporary and no file of an older layout.
        write_model(dir.path(), after.names, after.sharded, 7);
        CHECK(model_seen(dir.path(), true) == expected_seen(after.names, 7));
        CHECK(writer_test::temporaries(dir.path()).empty());
        CHECK(writer_test::entries(dir.path()).size() == (after.sharded ? after.names.size() + 1 : 1));
      }
      CHECK(completed);
      CHECK(steps_killed >= (after.sharded ? 4 : 1));  // every shard rename and the index's, at least
      // Only a change between single-file and sharded has a step with no model (the entry point of
      // the old layout moved aside just before the new one is renamed in), and only one.
      CHECK(no_model == (before.sharded != after.sharded ? 1 : 0));
    }
  }
}

TEST_CASE("writer fault: rewriting a sharded folder uses fresh shard names and removes the old ones") {
  ScratchDir dir;
  write_model(dir.path(), {"x", "y", "z"}, true, 1);
  const auto first = writer_test::entries(dir.path());
  CHECK(first == std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                           "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  // Leftovers of killed runs: temporaries (removed when the write starts) and an orphan shard.
  writer_test::write_file(dir.path(".model.safetensors.peft-tmp-abcdef"), std::string(1000, 'x'));
  writer_test::write_file(dir.path(".config.json.peft-tmp-ABC123"), "{}");
  writer_test::write_file(dir.path("model-00001-of-00009.peft-Zz9Zz9Zz.safetensors"), "orphan");
  writer_test::write_file(dir.path("notes.txt"), "not ours");
  ShardedWriter writer(dir.path(), 1u << 20);
  for (const char* name : {"a", "b", "c"}) writer.add_tensor(name, DType::U8, {1u << 20});
  writer.start();
  CHECK(writer_test::temporaries(dir.path()).empty());
  stream_all(writer, 9);
  const auto names = writer.shard_names();
  REQUIRE(names.size() == 3);
  for (const std::string& name : names) {
    CHECK(is_tokenized_weight_name(name));
    CHECK(name.rfind("model-0000", 0) == 0);
  }
  std::vector<std::string> expected = names;
  expected.push_back("model.safetensors.index.json");
  expected.push_back("notes.txt");
  std::sort(expected.begin(), expected.end());
  CHECK(writer_test::entries(dir.path()) == expected);
  CHECK(model_seen(dir.path(), false) == expected_seen({"a", "b", "c"}, 9));
  // A third write finds the plain names free again.
  write_model(dir.path(), {"a", "b", "c"}, true, 5);
  std::vector<std::string> third = first;
  third.push_back("notes.txt");
  CHECK(writer_test::entries(dir.path()) == third);
}
