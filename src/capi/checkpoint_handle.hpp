// The C handle of an opened checkpoint, shared by the reading and writing C API files.
#pragma once

#include <memory>

#include "checkpoint/checkpoint.hpp"

struct peft_checkpoint {
  std::shared_ptr<const peft::Checkpoint> impl;
};
