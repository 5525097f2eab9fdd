// Each method's config reader and module resolution (MethodRow::read_config and
// MethodRow::resolve, on the interfaces of method_config.hpp), as PEFT's config class and layer
// define them. The rows of method_table.cpp point at them; nothing else calls them directly.
#pragma once

#include "peft/methods/method_config.hpp"

namespace peft::method_fields {

void read_lycoris(const FieldReader& f, ConfigView& v, MethodConfig& out);  // LoHa, LoKr
void read_adalora(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_ia3(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_miss(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_shira(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_vera(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_randlora(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_fourierft(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_oft(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_boft(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_hra(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_ln_tuning(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_trainable_tokens(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_vblora(const FieldReader& f, ConfigView& v, MethodConfig& out);
void read_c3a(const FieldReader& f, ConfigView& v, MethodConfig& out);

void resolve_loha(ModuleResolution& m);
void resolve_lokr(ModuleResolution& m);
void resolve_adalora(ModuleResolution& m);
void resolve_ia3(ModuleResolution& m);
void resolve_miss(ModuleResolution& m);
void resolve_shira(ModuleResolution& m);
void resolve_vera(ModuleResolution& m);
void resolve_randlora(ModuleResolution& m);
void resolve_fourierft(ModuleResolution& m);
void resolve_oft(ModuleResolution& m);
void resolve_boft(ModuleResolution& m);
void resolve_hra(ModuleResolution& m);
void resolve_vblora(ModuleResolution& m);
void resolve_c3a(ModuleResolution& m);

}  // namespace peft::method_fields
