// The C handle of export options, shared by the export section (export_api.cpp) and the whole-model
// combination of the merge section (merge_api.cpp), which reads its combination settings. Only
// src/capi includes this.
#pragma once

#include "peft/combine/adapter_combine.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft_c.h"

struct peft_export_options {
  peft::ExportOptions impl;
  peft::CombineSettings combine;  // read by the combinations only
};
