package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Registry holds adapters registered under names over one base model, for serving: registering
// reads only an adapter's config and header; Acquire loads its LoRA tensors on first use, converted
// to the registry's storage dtype, and keeps them under a byte budget, least recently used first
// out. An acquired adapter (a Lease) is never evicted while a Lease or a HostModel holds it.
// Every method may be called from many goroutines at once.
type Registry struct {
	h handle
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
	r := &Registry{}
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

// checkRegistryName refuses names the registry could not list back: Names separates them with newlines.
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
	var out *C.char
	if err := takeError(C.peft_registry_names(p, &out)); err != nil {
		return nil, err
	}
	text := strings.TrimSuffix(takeString(out), "\n")
	if text == "" {
		return []string{}, nil
	}
	return strings.Split(text, "\n"), nil
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
	l := &Lease{}
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
	h handle
}

func freeLease(p unsafe.Pointer) { C.peft_lease_release((*C.peft_lease)(p)) }

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

// LoraApply adds the LoRA contribution of each row's adapter to one layer's output, without merging,
// as PEFT's forward of an unmerged model with mixed-batch adapter_names does:
// y[i] += scaling * (x[i] A^T) B^T (plus scaling * lora_B.bias with lora_bias), computed in float32
// and rounded once into y's dtype. x is [rows, in_features] and y [rows, out_features], row-major,
// F32, BF16 or F16 (Float32Buffer and Uint16Buffer view slices without copying); y is changed in
// place.
//
// Row i uses leases[rowLease[i]]; -1 means no adapter. A nil rowLease uses leases[0] for every row.
// Rows without an adapter, or whose adapter has no layer module, are left unchanged. module is named
// as for Lease.HasModule.
//
// Errors, with y unchanged: ErrShapeMismatch naming the adapter whose layer does not fit x and y;
// ErrUnsupported for a DoRA, embedding or Conv2d layer or another dtype; ErrInvalidArgument for an
// index out of range or buffers that do not match their shapes. Calls writing different outputs
// may run at once, also with the same leases.
func LoraApply(module string, leases []*Lease, rowLease []int32, x, y Buffer) error {
	if len(leases) == 0 {
		return argError("no leases given")
	}
	if err := x.check("activation buffer"); err != nil {
		return err
	}
	if err := y.check("output buffer"); err != nil {
		return err
	}
	if len(x.Shape) != 2 || len(y.Shape) != 2 {
		return argError("the activations (shape %v) and the output (shape %v) must be [rows, features]", x.Shape, y.Shape)
	}
	rows := x.Shape[0]
	if y.Shape[0] != rows {
		return argError("the activations have %d rows and the output %d", rows, y.Shape[0])
	}
	if rowLease != nil && uint64(len(rowLease)) != rows {
		return argError("rowLease has %d entries for %d rows", len(rowLease), rows)
	}
	var cs cstrings
	defer cs.free()
	cmodule, err := cs.add(module, "module name")
	if err != nil {
		return err
	}
	// The C array of lease pointers lives in Go memory: it holds C pointers only, and the library
	// reads it during the call.
	cleases := make([]*C.peft_lease, len(leases))
	for i, l := range leases {
		if l == nil {
			return argError("lease %d is nil", i)
		}
		p, err := l.use()
		if err != nil {
			return err
		}
		defer l.done()
		cleases[i] = p
	}
	if rows == 0 {
		return nil // nothing to add; the library is not asked to read empty buffers
	}
	var crows *C.int32_t
	if rowLease != nil {
		crows = (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(rowLease)))
	}
	err = takeError(C.peft_lora_apply(cmodule, (**C.peft_lease)(unsafe.Pointer(unsafe.SliceData(cleases))),
		C.size_t(len(cleases)), crows, bytePtr(x.Data), C.int32_t(x.DType), C.uint64_t(rows),
		C.uint64_t(x.Shape[1]), bytePtr(y.Data), C.int32_t(y.DType), C.uint64_t(y.Shape[1])))
	runtime.KeepAlive(cleases)
	runtime.KeepAlive(rowLease)
	runtime.KeepAlive(x.Data)
	runtime.KeepAlive(y.Data)
	return err
}

// HostModel is the weight buffers of a host's model, into which adapters of a Registry are swapped:
// the host gives each buffer once (AddWeight), then Swap switches the adapter merged into them, in
// place. It belongs to one goroutine at a time (a second concurrent call fails with ErrBusy), and
// nothing else may read or write its buffers during a Swap. While it lives it owns the buffers'
// contents: the host reads them but does not write them (in exact mode, taking an adapter out
// writes the original bytes back, whatever the buffers hold).
type HostModel struct {
	h       handle
	buffers *hostBuffers
}

// hostBuffers holds the pins of what the library's host model points into: the weight and bias
// buffers are the host's own memory, pinned (runtime.Pinner) because the library keeps their
// addresses between calls (cgo lets C keep a Go pointer only while it is pinned). The handle's free
// function unpins them after the C object is freed; it must not reach the HostModel (or the
// HostModel would never become unreachable).
type hostBuffers struct {
	mu     sync.Mutex // the runtime cleanup may run on another goroutine than the last call
	pinner runtime.Pinner
}

// free releases the C host model, then the pins.
func (b *hostBuffers) free(p unsafe.Pointer) {
	C.peft_host_model_free((*C.peft_host_model)(p))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pinner.Unpin()
}

// SwapStats is what a Swap did.
type SwapStats struct {
	RemoveTime    time.Duration // taking the previous adapter out
	MergeTime     time.Duration // merging the new adapter in
	LayersRemoved uint64        // layers of the previous adapter taken out
	LayersMerged  uint64        // layers of the new adapter merged in
	SavedBytes    uint64        // bytes of original weights (and biases) kept for exact removal
}

// NewHostModel creates a host model with no weights. By default it reads HuggingFace names and
// restores buffers bit for bit when an adapter is swapped out (see SetExact).
func NewHostModel() (*HostModel, error) {
	var out *C.peft_host_model
	if err := takeError(C.peft_host_model_new(&out)); err != nil {
		return nil, err
	}
	m := &HostModel{buffers: &hostBuffers{}}
	track(m, &m.h, unsafe.Pointer(out), "HostModel", m.buffers.free)
	return m, nil
}

// Close releases the host model and its hold on the merged adapter without touching the buffers
// (Swap to nil first to leave them as they were); the buffers are unpinned. Idempotent; returns nil.
func (m *HostModel) Close() error {
	if m == nil {
		return nil
	}
	m.h.close()
	return nil
}

func (m *HostModel) use() (*C.peft_host_model, error) {
	p, err := m.h.acquireExclusive()
	return (*C.peft_host_model)(p), err
}

func (m *HostModel) done() {
	m.h.releaseExclusive()
	runtime.KeepAlive(m)
}

// SetTranslator makes the host model read weight names as the host's own names, through a
// translator (nil: HuggingFace names, the default). Only before the first AddWeight
// (ErrInvalidArgument afterwards). The table is shared; the translator may be closed afterwards.
func (m *HostModel) SetTranslator(t *Translator) error {
	p, err := m.use()
	if err != nil {
		return err
	}
	defer m.done()
	var tp *C.peft_translator
	if t != nil {
		if tp, err = t.use(); err != nil {
			return err
		}
		defer t.done()
	}
	return takeError(C.peft_host_model_set_translator(p, tp))
}

// SetExact chooses how a Swap takes an adapter out, from the next merge on (a layer comes out the
// way it went in): exact (the default) keeps a copy of each weight's bytes from its first exact
// merge, for the host model's life (the size of the adapted weights, once), and writes it back, bit
// for bit; not exact applies PEFT's arithmetic unmerge, which in BF16/F16 may change last bits,
// swap after swap (copies already taken are kept).
func (m *HostModel) SetExact(exact bool) error {
	p, err := m.use()
	if err != nil {
		return err
	}
	defer m.done()
	return takeError(C.peft_host_model_set_exact(p, boolInt(exact)))
}

// AddWeight gives the host model one weight buffer, which it keeps using, in place, until Close
// (the buffer stays pinned until then). name is the weight's or its layer's name (a HuggingFace name
// with or without "base_model.model.", or the host's name with SetTranslator). weight is row-major
// F32, BF16 or F16: [out, in] for Linear, [in, out] for GPT-2 Conv1D, [num_embeddings, dim] for
// embeddings, [out, in, kh, kw] for Conv2d. bias is the layer's bias (out_features elements), needed
// by adapters with lora_bias, or nil; it is kept and pinned like the weight. The library is told
// its length (bias.Shape is not read) and never writes past it: a Swap of an adapter whose layer
// has another number of output features fails with ErrShapeMismatch.
//
// Errors: ErrUnresolvedKey when the translator does not resolve name; ErrInvalidArgument for a
// layer given twice, a call while an adapter is merged, a buffer that does not match its shape or a
// bias that is not whole elements; ErrShapeMismatch for a zero dimension or an empty bias;
// ErrUnsupported for another dtype.
func (m *HostModel) AddWeight(name string, weight Buffer, bias *Buffer) error {
	if err := weight.check("weight buffer"); err != nil {
		return err
	}
	var biasPtr unsafe.Pointer
	var biasDType DType
	var biasElements uint64
	if bias != nil {
		if err := checkBiasDType(*bias); err != nil {
			return err
		}
		// The library refuses a bias of no elements too, but an empty slice has no address to
		// pass it as, and NULL would mean no bias at all.
		if len(bias.Data) == 0 {
			return &Error{Code: CodeShapeMismatch, Message: fmt.Sprintf("the bias given for %s has no elements", name)}
		}
		biasPtr, biasDType, biasElements = bytePtr(bias.Data), bias.DType, uint64(len(bias.Data)/(bias.DType.Bits()/8))
	}
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "weight name")
	if err != nil {
		return err
	}
	p, err := m.use()
	if err != nil {
		return err
	}
	defer m.done()
	err = takeError(C.peft_host_model_add_weight(p, cname, bytePtr(weight.Data), C.int32_t(weight.DType),
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(weight.Shape))), C.size_t(len(weight.Shape)),
		biasPtr, C.int32_t(biasDType), C.uint64_t(biasElements)))
	runtime.KeepAlive(weight.Shape)
	if err != nil {
		return err
	}
	// The call's arguments kept the buffers alive until now; from here on the library keeps their
	// addresses, so they are pinned until the host model is freed.
	m.buffers.mu.Lock()
	defer m.buffers.mu.Unlock()
	if len(weight.Data) > 0 {
		m.buffers.pinner.Pin(&weight.Data[0])
	}
	if biasPtr != nil {
		m.buffers.pinner.Pin(&bias.Data[0])
	}
	return nil
}

// Swap switches the adapter merged into the host's buffers: it takes the current one out (if any)
// and merges lease's in (nil for none), its scaling multiplied by weight (1.0 for the adapter as
// trained). Everything is checked before a buffer changes, and on failure the buffers hold what
// they held before. The host model holds the new adapter (pinned in its registry) until the next
// Swap or Close; the caller may close its lease at once.
//
// Errors: ErrUnresolvedKey listing the adapter's layers the host model has no weight for;
// ErrShapeMismatch naming a layer whose weight, or whose bias's length, does not fit;
// ErrUnsupported for an adapter that replaces whole tensors (modules_to_save, trainable tokens);
// ErrInvalidArgument for a weight that is not finite, a missing bias, or two layers of the adapter
// on one weight; ErrOutOfMemory.
func (m *HostModel) Swap(lease *Lease, weight float64) (SwapStats, error) {
	p, err := m.use()
	if err != nil {
		return SwapStats{}, err
	}
	defer m.done()
	var lp *C.peft_lease
	if lease != nil {
		if lp, err = lease.use(); err != nil {
			return SwapStats{}, err
		}
		defer lease.done()
	}
	var s C.struct_peft_swap_stats
	s.size = C.uint64_t(unsafe.Sizeof(s))
	err = takeError(C.peft_host_model_swap(p, lp, C.double(weight), &s))
	if err != nil {
		return SwapStats{}, err
	}
	return SwapStats{
		RemoveTime:    seconds(float64(s.remove_seconds)),
		MergeTime:     seconds(float64(s.merge_seconds)),
		LayersRemoved: uint64(s.layers_removed),
		LayersMerged:  uint64(s.layers_merged),
		SavedBytes:    uint64(s.saved_bytes),
	}, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Current is the name of the adapter merged into the buffers; "" when none (or after Close).
func (m *HostModel) Current() string {
	p, err := m.use()
	if err != nil {
		return ""
	}
	defer m.done()
	return goString(C.peft_host_model_current(p))
}
