// The strings section of the C API: releasing returned strings, and reading and releasing lists.
#include <cstdlib>

#include "capi/string_list.hpp"

extern "C" {

void peft_string_free(char* text) { std::free(text); }

size_t peft_string_list_count(const peft_string_list* list) { return list ? list->items.size() : 0; }

const char* peft_string_list_get(const peft_string_list* list, size_t index) {
  if (list == nullptr || index >= list->items.size()) return nullptr;
  return list->items[index].c_str();
}

void peft_string_list_free(peft_string_list* list) { delete list; }

}  // extern "C"
