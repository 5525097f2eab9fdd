// Finding names in a list: the one name index behind every reader's duplicate check and every find
// by name (a safetensors header's tensors, a GGUF file's keys and tensors, a checkpoint of several
// files). A file's index is built once, by its parser, and serves its finds afterwards.
//
// An open-addressing table with linear probing, at most half full, of 8-byte slots: a position in
// the caller's list and 32 bits of its name's hash, so that a probe compares names only when their
// hashes agree. The names stay where the caller keeps them (`name_at(position)`); the index holds no
// copy and allocates nothing per name, where the std::unordered_map and unordered_set of string
// views it replaced took an allocation per name (docs/benchmarks.md, "Against the native readers").
//
// The hash is keyed with a seed drawn once per process, so that a crafted file cannot choose names
// that collide; lookups stay O(1) expected. Nothing the library returns depends on the seed: the
// index answers positions, and every list keeps its own order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace peft {

// The 64-bit keyed hash of `name` (seed drawn once per process).
uint64_t name_hash(std::string_view name);

// Fails with PEFT_ERR_UNSUPPORTED: a position at or above 2^32 - 1 (no reader's size limit lets a list
// grow that long).
[[noreturn]] void name_index_position_too_large(size_t position);

// The index holds positions only, so it is a plain value (copied or moved with the list it indexes);
// every call that compares names is given `name_at`, a callable std::string_view(size_t position)
// answering the name at a position added before.
class NameIndex {
 public:
  // Room for `count` names in all without growing.
  void reserve(size_t count) {
    size_t slots = 16;
    while (slots < 2 * count) slots *= 2;
    if (slots > slots_.size()) rehash(slots);
  }

  size_t size() const { return count_; }

  // The position of `name`, if it was added.
  template <class NameAt>
  std::optional<size_t> find(std::string_view name, const NameAt& name_at) const {
    if (count_ == 0) return std::nullopt;
    const uint32_t tag = tag_of(name);
    const size_t mask = slots_.size() - 1;
    for (size_t s = tag & mask;; s = (s + 1) & mask) {
      const Slot slot = slots_[s];
      if (slot.stored == 0) return std::nullopt;
      if (slot.tag == tag && name_at(slot.stored - 1) == name) return slot.stored - 1;
    }
  }

  // Adds `name` at `position` unless the name is there already; then adds nothing and returns the
  // position it was added at first. `name` is what name_at(position) will answer; name_at is only
  // asked about positions added before.
  template <class NameAt>
  std::optional<size_t> insert(std::string_view name, size_t position, const NameAt& name_at) {
    if (position >= UINT32_MAX - 1) name_index_position_too_large(position);
    if (2 * (count_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
    const uint32_t tag = tag_of(name);
    const size_t mask = slots_.size() - 1;
    size_t s = tag & mask;
    for (;; s = (s + 1) & mask) {
      const Slot slot = slots_[s];
      if (slot.stored == 0) break;
      if (slot.tag == tag && name_at(slot.stored - 1) == name) return slot.stored - 1;
    }
    slots_[s] = Slot{tag, static_cast<uint32_t>(position + 1)};
    ++count_;
    return std::nullopt;
  }

 private:
  struct Slot {
    uint32_t tag = 0;     // the low 32 bits of the name's hash: its first slot, and a quick compare
    uint32_t stored = 0;  // position + 1; 0 marks an empty slot
  };

  // The table never outgrows 2^32 slots (positions are below 2^32 - 1, at most half the slots are
  // used), so 32 bits of the hash pick the slot at every size and growing needs no name again.
  static uint32_t tag_of(std::string_view name) { return static_cast<uint32_t>(name_hash(name)); }

  // Moves every entry into `count` slots (a power of two).
  void rehash(size_t count) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(count, Slot{});
    const size_t mask = count - 1;
    for (const Slot& slot : old) {
      if (slot.stored == 0) continue;
      size_t s = slot.tag & mask;
      while (slots_[s].stored != 0) s = (s + 1) & mask;
      slots_[s] = slot;
    }
  }

  std::vector<Slot> slots_;  // empty, or a power of two in size
  size_t count_ = 0;
};

// The names of a tensor list, as a NameIndex asks for them.
template <class List>
class NamesOf {
 public:
  explicit NamesOf(const List& list) : list_(list) {}
  std::string_view operator()(size_t i) const { return list_[i].name; }

 private:
  const List& list_;
};

}  // namespace peft
