// Paths as strings, the way the library shows them to users: "dir/name" with one separator.
#pragma once

#include <string>

namespace peft {

// `folder` joined with `name` ("dir/name", one separator; `name` alone when `folder` is empty).
std::string join_path(const std::string& folder, const std::string& name);

// The folder part of a path ("." when there is none, "/" for a file in the root).
std::string parent_folder(const std::string& path);

// The last component of a path (the whole path when it has no '/').
std::string file_name(const std::string& path);

}  // namespace peft
