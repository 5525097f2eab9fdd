// Serving, the host-model part (src/capi/serve_host_api.cpp): HostModel, the host's weight buffers
// into which adapters are swapped, and SwapStats.

package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

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
// embeddings, [experts, out, in] for a fused expert parameter, [out, in, kh, kw] for Conv2d. bias
// is the layer's bias (out_features elements), needed by adapters with lora_bias, or nil; it is
// kept and pinned like the weight. The library is told its length (bias.Shape is not read) and
// never writes past it: a Swap of an adapter whose layer has another number of output features
// fails with ErrShapeMismatch.
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
