// The C handles of low-rank options and reports, shared by the export section's files (extraction
// and conversion in lowrank_api.cpp, the delta-space combination in export_api.cpp). Only src/capi
// includes this.
#pragma once

#include <utility>
#include <vector>

#include "peft/lowrank/lora_lowrank.hpp"
#include "peft_c.h"

struct peft_lowrank_options {
  peft::LowRankOptions impl;
};

struct peft_lowrank_report {
  std::vector<peft::LowRankModule> modules;
};

namespace peft::capi {

// Gives the modules to *out_report as a new report, unless out_report is NULL.
inline void hand_out_report(std::vector<LowRankModule>&& modules, peft_lowrank_report** out_report) {
  if (out_report == nullptr) return;
  auto* report = new peft_lowrank_report();
  report->modules = std::move(modules);
  *out_report = report;
}

}  // namespace peft::capi
