// Serving, the registry part (src/capi/serve_registry_api.cpp): Registry, its options and stats, and
// the Leases that pin its adapters.

package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Registry holds adapters registered under names over one base model, for serving: registering
// reads only an adapter's config and header; Acquire loads its LoRA tensors on first use, converted
// to the registry's storage dtype, and keeps them under a byte budget, least recently used first
// out. An acquired adapter (a Lease) is never evicted while a Lease or a HostModel holds it.
// Every method may be called from many goroutines at once.
type Registry struct {
	h    handle
	base *baseWeights
}

// RegistryStats are the counters of a registry, read in one consistent snapshot.
type RegistryStats struct {
	BudgetBytes     uint64 // the byte budget
	LoadedBytes     uint64 // bytes of adapter tensors in memory now (never above the budget)
	PeakLoadedBytes uint64 // the highest LoadedBytes seen
	Registered      uint64 // names registered now
	Loaded          uint64 // adapter versions in memory now (replaced versions still leased included)
	Pinned          uint64 // of those, versions held by a Lease or a HostModel
	Loads           uint64 // loads of tensors since the registry was made
	Hits            uint64 // acquisitions that found the tensors in memory
	Evictions       uint64 // loaded versions evicted to make room or by Trim
}

// RegistryOption sets an option of NewRegistry.
type RegistryOption func(*registryConfig)

type registryConfig struct {
	translator *Translator
}

// WithRegistryNativeNames makes LoraApply read layer names as the host's own names, through a
// translator. The table is shared; the translator may be closed afterwards.
func WithRegistryNativeNames(t *Translator) RegistryOption {
	return func(c *registryConfig) { c.translator = t }
}

// NewRegistry creates an empty registry whose loaded tensors are kept in storage (F32, BF16 or F16;
// rounded to nearest even, as torch's .to()) and take at most budgetBytes at once.
func NewRegistry(storage DType, budgetBytes uint64, opts ...RegistryOption) (*Registry, error) {
	var cfg registryConfig
	for _, o := range opts {
		o(&cfg)
	}
	var tp *C.peft_translator
	if cfg.translator != nil {
		var err error
		if tp, err = cfg.translator.use(); err != nil {
			return nil, err
		}
		defer cfg.translator.done()
	}
	var out *C.peft_registry
	if err := takeError(C.peft_registry_new(C.int32_t(storage), C.uint64_t(budgetBytes), tp, &out)); err != nil {
		return nil, err
	}
	r := &Registry{base: newBaseWeights()}
	track(r, &r.h, unsafe.Pointer(out), "Registry", freeRegistry)
	return r, nil
}

func freeRegistry(p unsafe.Pointer) { C.peft_registry_free((*C.peft_registry)(p)) }

// Close releases the registry. Leases and host models holding its adapters keep them until they
// are closed. Idempotent; returns nil.
func (r *Registry) Close() error {
	if r == nil {
		return nil
	}
	r.h.close()
	return nil
}

func (r *Registry) use() (*C.peft_registry, error) {
	p, err := r.h.acquire()
	return (*C.peft_registry)(p), err
}

func (r *Registry) done() {
	r.h.release()
	runtime.KeepAlive(r)
}

// checkRegistryName refuses a name with a newline, as the library does (its older peft_registry_names
// lists names one per line), with a message in the binding's terms.
func checkRegistryName(name string) error {
	if strings.IndexByte(name, '\n') >= 0 {
		return argError("adapter name %q contains a newline (Names could not list it)", name)
	}
	return nil
}

// Register registers the adapter in folder dir under name (UTF-8, not empty), or replaces the
// adapter of that name for later acquisitions (leases on the old version keep it). The folder is
// opened and validated as OpenAdapter does, with the same options and errors, reading no tensor
// data; ErrUnsupported for LoRA tensors that are not F64, F32, F16 or BF16. On failure the registry
// is unchanged.
func (r *Registry) Register(name, dir string, opts ...AdapterOption) error {
	if err := checkRegistryName(name); err != nil {
		return err
	}
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "adapter name")
	if err != nil {
		return err
	}
	cdir, err := cs.add(dir, "adapter folder")
	if err != nil {
		return err
	}
	o, err := newAdapterOptions(opts)
	if err != nil {
		return err
	}
	defer C.peft_adapter_options_free(o)
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	return takeError(C.peft_registry_register(p, cname, cdir, o))
}

// RegisterBytes is Register for an adapter held in memory: the text of adapter_config.json and the
// bytes of adapter_model.safetensors, both copied (they may be changed or dropped afterwards).
// Format errors for weights that are not a valid safetensors file; ErrInvalidConfig for a config
// that is not valid.
func (r *Registry) RegisterBytes(name, configJSON string, weights []byte, opts ...AdapterOption) error {
	if err := checkRegistryName(name); err != nil {
		return err
	}
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "adapter name")
	if err != nil {
		return err
	}
	cconfig, err := cs.add(configJSON, "adapter config")
	if err != nil {
		return err
	}
	o, err := newAdapterOptions(opts)
	if err != nil {
		return err
	}
	defer C.peft_adapter_options_free(o)
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	err = takeError(C.peft_registry_register_memory(p, cname, cconfig, bytePtr(weights), C.size_t(len(weights)), o))
	runtime.KeepAlive(weights)
	return err
}

// Unregister removes a name (ErrNotFound if it is not registered). Leases on its adapter keep
// working; its memory goes with the last of them.
func (r *Registry) Unregister(name string) error {
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "adapter name")
	if err != nil {
		return err
	}
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	return takeError(C.peft_registry_unregister(p, cname))
}

// Names lists the registered names, in the order they were first registered.
func (r *Registry) Names() ([]string, error) {
	p, err := r.use()
	if err != nil {
		return nil, err
	}
	defer r.done()
	var out *C.peft_string_list
	if err := takeError(C.peft_registry_name_list(p, &out)); err != nil {
		return nil, err
	}
	return takeStringList(out), nil
}

// Warnings are what lenient loading (WithLenient) ignored when the adapter registered under name now
// was registered, as Adapter.Warnings gives them; empty for a strict registration. ErrNotFound for a
// name not registered.
func (r *Registry) Warnings(name string) ([]string, error) {
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "adapter name")
	if err != nil {
		return nil, err
	}
	p, err := r.use()
	if err != nil {
		return nil, err
	}
	defer r.done()
	var out *C.peft_string_list
	if err := takeError(C.peft_registry_warning_list(p, cname, &out)); err != nil {
		return nil, err
	}
	return takeStringList(out), nil
}

// Acquire returns a lease on the adapter registered under name, loading its tensors if they are
// not in memory (evicting unpinned adapters, least recently used first, to make room). The adapter
// stays pinned until the lease is closed. Goroutines acquiring an adapter that is being loaded wait
// for that one load.
//
// Errors: ErrNotFound for a name not registered; ErrOverBudget when the adapter does not fit in
// the budget beside the pinned ones; ErrIO or a format error when its file changed or went away
// since it was registered; ErrOutOfMemory.
func (r *Registry) Acquire(name string) (*Lease, error) {
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "adapter name")
	if err != nil {
		return nil, err
	}
	p, err := r.use()
	if err != nil {
		return nil, err
	}
	defer r.done()
	var out *C.peft_lease
	if err := takeError(C.peft_registry_acquire(p, cname, &out)); err != nil {
		return nil, err
	}
	l := &Lease{base: r.base}
	track(l, &l.h, unsafe.Pointer(out), "Lease", freeLease)
	return l, nil
}

// Trim evicts every loaded adapter that nothing pins.
func (r *Registry) Trim() error {
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	return takeError(C.peft_registry_trim(p))
}

// SetBudget changes the byte budget, evicting unpinned adapters (least recently used first) until
// the loaded bytes fit. ErrOverBudget, with nothing evicted and the budget unchanged, when the
// pinned adapters alone take more.
func (r *Registry) SetBudget(budgetBytes uint64) error {
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	return takeError(C.peft_registry_set_budget(p, C.uint64_t(budgetBytes)))
}

// Stats reads the registry's counters.
func (r *Registry) Stats() (RegistryStats, error) {
	p, err := r.use()
	if err != nil {
		return RegistryStats{}, err
	}
	defer r.done()
	var s C.struct_peft_registry_stats
	s.size = C.uint64_t(unsafe.Sizeof(s))
	if err := takeError(C.peft_registry_get_stats(p, &s)); err != nil {
		return RegistryStats{}, err
	}
	return RegistryStats{
		BudgetBytes: uint64(s.budget_bytes), LoadedBytes: uint64(s.loaded_bytes),
		PeakLoadedBytes: uint64(s.peak_loaded_bytes), Registered: uint64(s.registered),
		Loaded: uint64(s.loaded), Pinned: uint64(s.pinned), Loads: uint64(s.loads),
		Hits: uint64(s.hits), Evictions: uint64(s.evictions),
	}, nil
}

// Lease is an acquired adapter of a Registry: loaded and pinned until Close. It stays valid after
// its registry is closed. Every method, and LoraApply with it, may be called from many goroutines
// at once.
type Lease struct {
	h    handle
	base *baseWeights // the registry's base weights, which LoraApply with this lease may read
}

func freeLease(p unsafe.Pointer) { C.peft_lease_free((*C.peft_lease)(p)) }

// Close releases the lease: the adapter is unpinned, and becomes evictable once nothing else holds
// it. Idempotent; returns nil.
func (l *Lease) Close() error {
	if l == nil {
		return nil
	}
	l.h.close()
	return nil
}

func (l *Lease) use() (*C.peft_lease, error) {
	p, err := l.h.acquire()
	return (*C.peft_lease)(p), err
}

func (l *Lease) done() {
	l.h.release()
	runtime.KeepAlive(l)
}

// Name is the name the adapter was acquired under ("" after Close).
func (l *Lease) Name() string {
	p, err := l.use()
	if err != nil {
		return ""
	}
	defer l.done()
	return goString(C.peft_lease_name(p))
}

// Version is the registration the lease holds: the registry numbers registrations 1, 2, 3, ..., so
// a replacement has a higher version than what it replaced (0 after Close).
func (l *Lease) Version() uint64 {
	p, err := l.use()
	if err != nil {
		return 0
	}
	defer l.done()
	return uint64(C.peft_lease_version(p))
}

// Bytes is what the adapter's loaded tensors take, counted against the budget (0 after Close).
func (l *Lease) Bytes() uint64 {
	p, err := l.use()
	if err != nil {
		return 0
	}
	defer l.done()
	return uint64(C.peft_lease_bytes(p))
}

// HasModule reports whether the adapter has a LoRA layer of that name (a HuggingFace module path or
// weight name, with or without "base_model.model."; the host's name with WithRegistryNativeNames).
func (l *Lease) HasModule(module string) bool {
	var cs cstrings
	defer cs.free()
	cmodule, err := cs.add(module, "module name")
	if err != nil {
		return false
	}
	p, err := l.use()
	if err != nil {
		return false
	}
	defer l.done()
	return C.peft_lease_has_module(p, cmodule) != 0
}

// baseWeights keeps the buffers given to Registry.SetBaseWeight pinned (the library reads them
// without copying) while the registry or any of its leases is reachable: a runtime cleanup unpins
// them once none is.
type baseWeights struct{ pins *basePins }

type basePins struct {
	mu     sync.Mutex
	pinner runtime.Pinner
}

func newBaseWeights() *baseWeights {
	b := &baseWeights{pins: &basePins{}}
	runtime.AddCleanup(b, func(p *basePins) { p.mu.Lock(); p.pinner.Unpin(); p.mu.Unlock() }, b.pins)
	return b
}

func (b *baseWeights) pin(buffers ...[]byte) {
	b.pins.mu.Lock()
	defer b.pins.mu.Unlock()
	for _, data := range buffers {
		if len(data) > 0 {
			b.pins.pinner.Pin(unsafe.SliceData(data))
		}
	}
}

// SetBaseWeight gives the registry the host's base weight of one layer, which LoraApply needs for
// DoRA layers (their weight norm ||W + scaling B A|| per output feature), and the layer's bias, or
// nil for a layer without one. weight is laid out as the base model stores it ([out, in] for Linear,
// [in, out] for GPT-2 Conv1D), F32, BF16 or F16; bias holds the output features. For a DoRA layer
// the y given to LoraApply is then the base output with its bias.
//
// The buffers are borrowed, not copied: they stay pinned while the registry or any of its leases
// is reachable, and the host keeps their contents as they are while applies may run; after changing
// them it calls BaseWeightsChanged. Giving a layer again replaces its buffers. name is the weight's
// name or its layer's, as for LoraApply.
//
// Errors: ErrUnsupported for another dtype; ErrShapeMismatch for a weight that is not
// two-dimensional or an empty bias; ErrUnresolvedKey when the registry's translator does not resolve
// name; ErrInvalidArgument for buffers that do not match their shapes. Whether the shape fits a DoRA
// layer is checked by LoraApply (ErrShapeMismatch).
func (r *Registry) SetBaseWeight(name string, weight Buffer, bias *Buffer) error {
	if err := weight.check("base weight"); err != nil {
		return err
	}
	if len(weight.Data) == 0 {
		return argError("the base weight of %q is empty", name)
	}
	var biasPtr unsafe.Pointer
	var biasDType DType
	var biasElements uint64
	var biasData []byte
	if bias != nil {
		if err := bias.check("bias"); err != nil {
			return err
		}
		n, err := elementCount(bias.Shape)
		if err != nil {
			return err
		}
		if n == 0 {
			return &Error{Code: CodeShapeMismatch, Message: "the bias of " + strconv.Quote(name) + " has no elements"}
		}
		biasData, biasPtr, biasDType, biasElements = bias.Data, bytePtr(bias.Data), bias.DType, n
	}
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "weight name")
	if err != nil {
		return err
	}
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	r.base.pin(weight.Data, biasData)
	shape := make([]C.uint64_t, len(weight.Shape)) // Go memory without Go pointers: copied by the call
	for i, d := range weight.Shape {
		shape[i] = C.uint64_t(d)
	}
	var cshape *C.uint64_t
	if len(shape) > 0 {
		cshape = &shape[0]
	}
	return takeError(C.peft_registry_set_base_weight(p, cname, bytePtr(weight.Data), C.int32_t(weight.DType), cshape,
		C.size_t(len(shape)), biasPtr, C.int32_t(biasDType), C.uint64_t(biasElements)))
}

// BaseWeightsChanged tells the registry that the host changed the contents of the base weights (or
// biases) given with SetBaseWeight: every DoRA layer's scale is computed again, from the buffers as
// they are then, at its next LoraApply. Applies running at the same time finish with the scales
// they started with.
func (r *Registry) BaseWeightsChanged() error {
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	return takeError(C.peft_registry_base_weights_changed(p))
}
