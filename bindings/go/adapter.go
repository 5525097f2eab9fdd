package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"strconv"
	"unsafe"
)

// Adapter is a loaded PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors),
// with every tensor resolved to a module and a role and every module's rank, alpha and scaling
// computed as PEFT computes them. It is read-only: every method may be called from many goroutines
// at once.
type Adapter struct {
	h handle
}

// LayerKind is the kind of an adapter module (the PEFT_LAYER_* values).
type LayerKind int32

// The layer kinds.
const (
	LayerLinear          LayerKind = C.PEFT_LAYER_LINEAR           // nn.Linear: base [out, in]
	LayerConv1D          LayerKind = C.PEFT_LAYER_CONV1D           // transformers Conv1D (GPT-2): base [in, out]
	LayerEmbedding       LayerKind = C.PEFT_LAYER_EMBEDDING        // nn.Embedding: base [num, dim]
	LayerConv2D          LayerKind = C.PEFT_LAYER_CONV2D           // nn.Conv2d: base [out, in, kh, kw]
	LayerFull            LayerKind = C.PEFT_LAYER_FULL             // whole tensors replacing the base's
	LayerTrainableTokens LayerKind = C.PEFT_LAYER_TRAINABLE_TOKENS // rows replacing embedding rows
)

var layerKindNames = [...]string{"Linear", "Conv1D", "Embedding", "Conv2D", "Full", "TrainableTokens"}

func (k LayerKind) String() string {
	if k >= 0 && int(k) < len(layerKindNames) {
		return layerKindNames[k]
	}
	return "LayerKind(" + strconv.Itoa(int(k)) + ")"
}

// Module is one module of an adapter: a LoRA layer, or a module with full replacement tensors.
type Module struct {
	Index        int
	Name         string    // transformers module path, without "base_model.model."
	Kind         LayerKind //
	Rank         int64     // LoRA rank (0 for full and trainable-token modules)
	Alpha        float64   // LoRA alpha (0 for full and trainable-token modules)
	Scaling      float64   // alpha / rank, or alpha / sqrt(rank) with rsLoRA
	Tensors      []ModuleTensor
	TokenIndices []int64 // rows of a trainable-tokens module; nil for other modules
}

// ModuleTensor is one tensor of a module.
type ModuleTensor struct {
	Role     string   // e.g. "lora_A.weight", "lora_B.bias", "lora_magnitude_vector", "weight"
	Key      string   // the key in adapter_model.safetensors
	BaseName string   // the base model tensor it applies to or replaces
	DType    DType    //
	Shape    []uint64 //
}

// AdapterOption sets an option of OpenAdapter.
type AdapterOption func(*adapterConfig)

type adapterConfig struct {
	baseDir    string
	translator *Translator
	lenient    bool
}

// WithBaseDir opens the adapter against a base model folder: "all-linear" and an absent
// target_modules are expanded as PEFT does, Linear and GPT-2 Conv1D layers are told apart by the
// base's shapes, and every module is validated against the base.
func WithBaseDir(dir string) AdapterOption { return func(c *adapterConfig) { c.baseDir = dir } }

// WithTranslator makes the adapter use this translator's architecture table instead of detecting
// one. The table is shared; the translator may be closed afterwards.
func WithTranslator(t *Translator) AdapterOption { return func(c *adapterConfig) { c.translator = t } }

// WithLenient loads the adapter as PEFT's PeftModel.from_pretrained does: what PEFT ignores
// (unexpected keys, missing keys that leave a layer without effect) is dropped and listed by
// Adapter.Warnings; what PEFT refuses stays an error. Strict loading is the default.
func WithLenient() AdapterOption { return func(c *adapterConfig) { c.lenient = true } }

// OpenAdapter opens a PEFT LoRA adapter folder.
//
// Errors: ErrNotFound for a missing folder or file; ErrUnsupported for a pickle, a non-LoRA
// peft_type or a LoRA variant peft_c does not merge; ErrInvalidConfig for a wrong config or one that
// does not match the tensors; ErrUnresolvedKey for keys that are not PEFT adapter keys (or, with a
// base, tensors the base lacks); ErrShapeMismatch (with a base); ErrInvalidCheckpoint; the format
// errors for a damaged safetensors file.
func OpenAdapter(dir string, opts ...AdapterOption) (*Adapter, error) {
	var cs cstrings
	defer cs.free()
	cdir, err := cs.add(dir, "adapter folder")
	if err != nil {
		return nil, err
	}
	o, err := newAdapterOptions(opts)
	if err != nil {
		return nil, err
	}
	defer C.peft_adapter_options_free(o)
	var out *C.peft_adapter
	if err := takeError(C.peft_adapter_open(cdir, o, &out)); err != nil {
		return nil, err
	}
	a := &Adapter{}
	track(a, &a.h, unsafe.Pointer(out), "Adapter", freeAdapter)
	return a, nil
}

// newAdapterOptions builds the C options of OpenAdapter and Registry.Register; the caller frees them
// with peft_adapter_options_free.
func newAdapterOptions(opts []AdapterOption) (*C.peft_adapter_options, error) {
	var cfg adapterConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	var cs cstrings
	defer cs.free()
	cbase, err := cs.addOptional(cfg.baseDir, "base folder")
	if err != nil {
		return nil, err
	}
	var o *C.peft_adapter_options
	if err := takeError(C.peft_adapter_options_new(&o)); err != nil {
		return nil, err
	}
	err = takeError(C.peft_adapter_options_set_base_dir(o, cbase)) // the options keep a copy
	if err == nil && cfg.lenient {
		err = takeError(C.peft_adapter_options_set_lenient(o, 1))
	}
	if err == nil && cfg.translator != nil {
		var tp *C.peft_translator
		if tp, err = cfg.translator.use(); err == nil {
			err = takeError(C.peft_adapter_options_set_translator(o, tp))
			cfg.translator.done()
		}
	}
	if err != nil {
		C.peft_adapter_options_free(o)
		return nil, err
	}
	return o, nil
}

func freeAdapter(p unsafe.Pointer) { C.peft_adapter_free((*C.peft_adapter)(p)) }

// Close releases the adapter (translators obtained from it stay valid). Idempotent; returns nil.
func (a *Adapter) Close() error {
	if a == nil {
		return nil
	}
	a.h.close()
	return nil
}

func (a *Adapter) use() (*C.peft_adapter, error) {
	p, err := a.h.acquire()
	return (*C.peft_adapter)(p), err
}

func (a *Adapter) done() {
	a.h.release()
	runtime.KeepAlive(a)
}

// str runs a getter returning a borrowed string; "" when closed or NULL.
func (a *Adapter) str(get func(*C.peft_adapter) *C.char) string {
	p, err := a.use()
	if err != nil {
		return ""
	}
	defer a.done()
	return goString(get(p))
}

// Validate checks the adapter against a base model folder without changing it: ErrUnresolvedKey or
// ErrShapeMismatch listing every problem; ErrNotFound, ErrIO or format errors for the base folder.
func (a *Adapter) Validate(baseDir string) error {
	var cs cstrings
	defer cs.free()
	cbase, err := cs.add(baseDir, "base folder")
	if err != nil {
		return err
	}
	p, err := a.use()
	if err != nil {
		return err
	}
	defer a.done()
	return takeError(C.peft_adapter_validate(p, cbase))
}

// ConfigJSON is the adapter's config as PEFT writes it (indent 2, sorted keys, every field).
func (a *Adapter) ConfigJSON() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_config_json(p) })
}

// ConfigField is one field of the config as compact JSON ("LORA", 8, ["q_proj","v_proj"], null);
// ok is false when the file has no such field.
func (a *Adapter) ConfigField(field string) (json string, ok bool) {
	var cs cstrings
	defer cs.free()
	cfield, err := cs.add(field, "field")
	if err != nil {
		return "", false
	}
	p, err := a.use()
	if err != nil {
		return "", false
	}
	defer a.done()
	s := C.peft_adapter_config_field(p, cfield)
	if s == nil {
		return "", false
	}
	return C.GoString(s), true
}

// R is r as PEFT uses it (8 when the file has none).
func (a *Adapter) R() int64 {
	p, err := a.use()
	if err != nil {
		return 0
	}
	defer a.done()
	return int64(C.peft_adapter_r(p))
}

// LoraAlpha is lora_alpha as PEFT uses it (8 when the file has none).
func (a *Adapter) LoraAlpha() float64 {
	p, err := a.use()
	if err != nil {
		return 0
	}
	defer a.done()
	return float64(C.peft_adapter_lora_alpha(p))
}

func (a *Adapter) flag(get func(*C.peft_adapter) C.int32_t) bool {
	p, err := a.use()
	if err != nil {
		return false
	}
	defer a.done()
	return get(p) != 0
}

// UseRSLoRA reports use_rslora (scaling alpha / sqrt(r)).
func (a *Adapter) UseRSLoRA() bool {
	return a.flag(func(p *C.peft_adapter) C.int32_t { return C.peft_adapter_use_rslora(p) })
}

// UseDoRA reports use_dora.
func (a *Adapter) UseDoRA() bool {
	return a.flag(func(p *C.peft_adapter) C.int32_t { return C.peft_adapter_use_dora(p) })
}

// LoraBias reports lora_bias (lora_B carries a bias).
func (a *Adapter) LoraBias() bool {
	return a.flag(func(p *C.peft_adapter) C.int32_t { return C.peft_adapter_lora_bias(p) })
}

// FanInFanOut reports fan_in_fan_out as written in the file.
func (a *Adapter) FanInFanOut() bool {
	return a.flag(func(p *C.peft_adapter) C.int32_t { return C.peft_adapter_fan_in_fan_out(p) })
}

// PEFTType is peft_type ("LORA").
func (a *Adapter) PEFTType() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_peft_type(p) })
}

// Bias is bias: "none", "all" or "lora_only".
func (a *Adapter) Bias() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_bias(p) })
}

// TaskType is task_type, e.g. "CAUSAL_LM" ("" when null or absent).
func (a *Adapter) TaskType() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_task_type(p) })
}

// BaseModelNameOrPath is base_model_name_or_path ("" when null or absent).
func (a *Adapter) BaseModelNameOrPath() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_base_model_name_or_path(p) })
}

// Family is the architecture family whose table the adapter uses ("llama", "gpt2", ...; "" if none).
func (a *Adapter) Family() string {
	return a.str(func(p *C.peft_adapter) *C.char { return C.peft_adapter_family(p) })
}

// Translator returns a translator over the adapter's architecture table (ErrNotFound when it has
// none). It stays valid after the adapter is closed.
func (a *Adapter) Translator() (*Translator, error) {
	p, err := a.use()
	if err != nil {
		return nil, err
	}
	defer a.done()
	var out *C.peft_translator
	if err := takeError(C.peft_adapter_translator(p, &out)); err != nil {
		return nil, err
	}
	return newTranslator(out), nil
}

// Notes are things worth knowing that are not errors (an adapter name removed from keys, targets
// that could not be checked without a base, ...).
func (a *Adapter) Notes() []string {
	p, err := a.use()
	if err != nil {
		return nil
	}
	defer a.done()
	notes := make([]string, C.peft_adapter_note_count(p))
	for i := range notes {
		notes[i] = goString(C.peft_adapter_note(p, C.size_t(i)))
	}
	return notes
}

// Warnings are what lenient loading (WithLenient) ignored, one sentence each, starting with
// `unexpected key "<key>": ` or `missing key "<key>": `; nil for a strict adapter and after Close.
func (a *Adapter) Warnings() []string {
	p, err := a.use()
	if err != nil {
		return nil
	}
	defer a.done()
	n := int(C.peft_adapter_warning_count(p))
	if n == 0 {
		return nil
	}
	warnings := make([]string, n)
	for i := range warnings {
		warnings[i] = goString(C.peft_adapter_warning(p, C.size_t(i)))
	}
	return warnings
}

// ModuleCount is the number of modules (0 after Close).
func (a *Adapter) ModuleCount() int {
	p, err := a.use()
	if err != nil {
		return 0
	}
	defer a.done()
	return int(C.peft_adapter_module_count(p))
}

// FindModule returns the index of the module with this path (without "base_model.model."), or an
// ErrNotFound error.
func (a *Adapter) FindModule(name string) (int, error) {
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "module name")
	if err != nil {
		return -1, err
	}
	p, err := a.use()
	if err != nil {
		return -1, err
	}
	defer a.done()
	var index C.size_t
	if err := takeError(C.peft_adapter_find_module(p, cname, &index)); err != nil {
		return -1, err
	}
	return int(index), nil
}

// Module describes module `index` (0 .. ModuleCount-1).
func (a *Adapter) Module(index int) (Module, error) {
	p, err := a.use()
	if err != nil {
		return Module{}, err
	}
	defer a.done()
	return moduleInfo(p, index)
}

// Modules describes every module, in the order of their first tensor in the file.
func (a *Adapter) Modules() ([]Module, error) {
	p, err := a.use()
	if err != nil {
		return nil, err
	}
	defer a.done()
	modules := make([]Module, C.peft_adapter_module_count(p))
	for i := range modules {
		if modules[i], err = moduleInfo(p, i); err != nil {
			return nil, err
		}
	}
	return modules, nil
}

func moduleInfo(p *C.peft_adapter, index int) (Module, error) {
	if index < 0 || index >= int(C.peft_adapter_module_count(p)) {
		return Module{}, argError("module index %d is out of range", index)
	}
	m := C.size_t(index)
	mod := Module{
		Index:   index,
		Name:    goString(C.peft_adapter_module_name(p, m)),
		Kind:    LayerKind(C.peft_adapter_module_kind(p, m)),
		Rank:    int64(C.peft_adapter_module_rank(p, m)),
		Alpha:   float64(C.peft_adapter_module_alpha(p, m)),
		Scaling: float64(C.peft_adapter_module_scaling(p, m)),
		Tensors: make([]ModuleTensor, C.peft_adapter_module_tensor_count(p, m)),
	}
	for i := range mod.Tensors {
		t := C.size_t(i)
		mod.Tensors[i] = ModuleTensor{
			Role:     goString(C.peft_adapter_module_tensor_role(p, m, t)),
			Key:      goString(C.peft_adapter_module_tensor_key(p, m, t)),
			BaseName: goString(C.peft_adapter_module_tensor_base_name(p, m, t)),
			DType:    DType(C.peft_adapter_module_tensor_dtype(p, m, t)),
			Shape:    copyShape(C.peft_adapter_module_tensor_shape(p, m, t), C.peft_adapter_module_tensor_ndim(p, m, t)),
		}
	}
	var count C.size_t
	if rows := C.peft_adapter_module_token_indices(p, m, &count); rows != nil && count > 0 {
		mod.TokenIndices = make([]int64, int(count))
		for i, r := range unsafe.Slice(rows, int(count)) {
			mod.TokenIndices[i] = int64(r)
		}
	}
	return mod, nil
}

// Tensor returns the index of the tensor with this role (e.g. "lora_A.weight") in the module, or -1.
func (m Module) Tensor(role string) int {
	for i, t := range m.Tensors {
		if t.Role == role {
			return i
		}
	}
	return -1
}

// ReadTensorInto reads tensor `tensor` of module `module` into dst, converted to dtype (see
// Convert); dst must hold exactly its elements in dtype.
func (a *Adapter) ReadTensorInto(module, tensor int, dtype DType, dst []byte) error {
	if module < 0 || tensor < 0 {
		return argError("module %d / tensor %d is out of range", module, tensor)
	}
	p, err := a.use()
	if err != nil {
		return err
	}
	defer a.done()
	return takeError(C.peft_adapter_module_tensor_read(p, C.size_t(module), C.size_t(tensor), C.int32_t(dtype),
		bytePtr(dst), C.uint64_t(len(dst))))
}

// ReadTensorFloat32 returns tensor `tensor` of module `module` converted to float32.
func (a *Adapter) ReadTensorFloat32(module, tensor int) ([]float32, error) {
	m, err := a.Module(module)
	if err != nil {
		return nil, err
	}
	if tensor < 0 || tensor >= len(m.Tensors) {
		return nil, argError("tensor index %d is out of range for module %q", tensor, m.Name)
	}
	n, err := elementCount(m.Tensors[tensor].Shape)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := a.ReadTensorInto(module, tensor, F32, float32Bytes(out)); err != nil {
		return nil, err
	}
	return out, nil
}
