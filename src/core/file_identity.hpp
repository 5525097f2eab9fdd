// One guard against an output that is an input: before a job writes, the files and folders it would
// replace are compared with those it reads by identity (device and inode, links followed), so that a
// second path to the same file, a symbolic link or a bind mount is caught as well as the same name.
// A folder stands for itself and for the files directly inside it (a checkpoint or adapter folder is
// one level deep): an output file inside an input folder, an output folder holding an input file, and
// an output folder that is an input folder are all refused.
#pragma once

#include <string>
#include <vector>

namespace peft {

// An input of a job: what it is, for the message ("the base model folder"), and its path.
struct JobInput {
  std::string role;
  std::string path;
};

// Fails with PEFT_ERR_INVALID_ARGUMENT, naming the input's role and both paths, when `out` (a file or
// folder, existing or not) is, holds or lies directly in one of `inputs` as described above. Inputs
// that do not exist (a hub id, an empty string) are skipped. Reads only the entries of the folders given.
void refuse_output_over_inputs(const std::string& out, const std::vector<JobInput>& inputs);

}  // namespace peft
