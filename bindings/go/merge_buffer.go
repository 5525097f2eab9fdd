package peft

/*
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// Buffer is a weight (or bias) the host owns, for MergeBuffer: row-major elements of DType (F32,
// BF16 or F16) with the given shape. Data is changed in place. Float32Buffer and Uint16Buffer view
// typed slices as a Buffer without copying.
type Buffer struct {
	Data  []byte
	DType DType
	Shape []uint64
}

// Float32Buffer views a float32 slice as an F32 Buffer (no copy).
func Float32Buffer(data []float32, shape ...uint64) Buffer {
	return Buffer{Data: float32Bytes(data), DType: F32, Shape: shape}
}

// Uint16Buffer views a slice of 16-bit values as a BF16 or F16 Buffer (no copy).
func Uint16Buffer(data []uint16, dtype DType, shape ...uint64) Buffer {
	var b []byte
	if len(data) > 0 {
		b = unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), len(data)*2)
	}
	return Buffer{Data: b, DType: dtype, Shape: shape}
}

// check verifies that Data holds exactly the elements of Shape in DType, which the C API cannot
// check (it takes a bare pointer).
func (b Buffer) check(what string) error {
	if b.DType != F32 && b.DType != BF16 && b.DType != F16 {
		return &Error{Code: CodeUnsupported, Message: what + " dtype " + b.DType.String() + " is not supported (F32, BF16 and F16 are)"}
	}
	n, err := elementCount(b.Shape)
	if err != nil {
		return err
	}
	size, err := b.DType.byteSize(n)
	if err != nil {
		return err
	}
	if uint64(len(b.Data)) != size {
		return argError("the %s holds %d bytes; shape %v of %s needs %d", what, len(b.Data), b.Shape, b.DType, size)
	}
	return nil
}

// BufferMergeOption sets an option of MergeBuffer.
type BufferMergeOption func(*bufferMergeConfig)

type bufferMergeConfig struct {
	weight     float64
	keepRows   bool
	threads    uint32
	translator *Translator
}

// WithWeight sets the weight that multiplies the layer's LoRA scaling (default 1.0).
func WithWeight(weight float64) BufferMergeOption {
	return func(c *bufferMergeConfig) { c.weight = weight }
}

// WithKeepOriginalRows keeps the original bytes of every row the merge changes, so that
// MergeRecord.Remove restores the buffer bit for bit (costs up to the size of the weight).
func WithKeepOriginalRows(keep bool) BufferMergeOption {
	return func(c *bufferMergeConfig) { c.keepRows = keep }
}

// WithBufferThreads limits the threads one buffer merge uses (0, the default: one per core).
func WithBufferThreads(threads int) BufferMergeOption {
	return func(c *bufferMergeConfig) { c.threads = clampThreads(threads) }
}

// WithNativeNames makes MergeBuffer read the layer name as the host's own name, through a translator.
func WithNativeNames(t *Translator) BufferMergeOption {
	return func(c *bufferMergeConfig) { c.translator = t }
}

// MergeRecord is one adapter layer merged into a host buffer, and what removing it needs. It belongs
// to one goroutine at a time. Closing it does not undo the merge.
type MergeRecord struct {
	h           handle
	weightDType DType
	weightShape []uint64
	biasDType   DType
	biasBytes   int // -1 when the merge had no bias
}

func freeMergeRecord(p unsafe.Pointer) { C.peft_merge_record_free((*C.peft_merge_record)(p)) }

// MergeBuffer merges one LoRA layer of the adapter into a weight the caller owns, in place:
// W = round(W + weight * scaling * delta), rounded once to its dtype (DoRA as PEFT merges it). The
// layer's lora_B.bias, if any, is added to bias, which must then be given (nil otherwise).
//
// name is a HuggingFace module path ("model.layers.0.self_attn.q_proj") or tensor name (with
// ".weight"), with or without "base_model.model."; with WithNativeNames, the host's name. Linear
// weights are [out, in], GPT-2 Conv1D [in, out], embeddings [num, dim], Conv2d [out, in, kh, kw].
// On failure the buffers are unchanged. Merges into different buffers may run concurrently.
func (a *Adapter) MergeBuffer(name string, weight Buffer, bias *Buffer, opts ...BufferMergeOption) (*MergeRecord, error) {
	cfg := bufferMergeConfig{weight: 1}
	for _, o := range opts {
		o(&cfg)
	}
	if err := weight.check("weight buffer"); err != nil {
		return nil, err
	}
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(name, "layer name")
	if err != nil {
		return nil, err
	}
	o, err := newBufferOptions(cfg)
	if err != nil {
		return nil, err
	}
	defer C.peft_merge_buffer_options_free(o)
	p, err := a.use()
	if err != nil {
		return nil, err
	}
	defer a.done()
	checked := false
	if bias != nil {
		if err := checkBiasDType(*bias); err != nil {
			return nil, err
		}
		if want, ok := a.findLoraBiasLength(p, name, cfg.translator); ok {
			if err := checkBiasLength(*bias, want, name); err != nil {
				return nil, err
			}
			checked = true
		}
	}
	cbias, err := newCBias(bias, weight.Shape)
	if err != nil {
		return nil, err
	}
	defer cbias.free()
	var rec *C.peft_merge_record
	err = takeError(C.peft_merge_buffer_apply(p, cname, bytePtr(weight.Data), C.int32_t(weight.DType),
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(weight.Shape))), C.size_t(len(weight.Shape)),
		cbias.ptr, C.int32_t(cbias.dtype), o, &rec))
	runtime.KeepAlive(weight.Data)
	runtime.KeepAlive(weight.Shape)
	if err != nil {
		return nil, err
	}
	if bias != nil && !checked {
		// The binding could not find the layer before; now the record names it. A bias of the wrong
		// length was merged into the padded copy only: take the merge out again and refuse.
		module := goString(C.peft_merge_record_module(rec))
		if want, ok := loraBiasLength(p, module); ok {
			if err := checkBiasLength(*bias, want, name); err != nil {
				C.peft_merge_record_unmerge(rec, bytePtr(weight.Data), cbias.ptr)
				runtime.KeepAlive(weight.Data)
				C.peft_merge_record_free(rec)
				return nil, err
			}
		}
	}
	cbias.copyBack()
	r := &MergeRecord{weightDType: weight.DType, weightShape: slices.Clone(weight.Shape), biasBytes: -1}
	if bias != nil {
		r.biasDType, r.biasBytes = bias.DType, len(bias.Data)
	}
	track(r, &r.h, unsafe.Pointer(rec), "MergeRecord", freeMergeRecord)
	return r, nil
}

func newBufferOptions(cfg bufferMergeConfig) (*C.peft_merge_buffer_options, error) {
	var o *C.peft_merge_buffer_options
	if err := takeError(C.peft_merge_buffer_options_new(&o)); err != nil {
		return nil, err
	}
	err := takeError(C.peft_merge_buffer_options_set_weight(o, C.double(cfg.weight)))
	if err == nil {
		err = takeError(C.peft_merge_buffer_options_set_keep_original_rows(o, boolInt(cfg.keepRows)))
	}
	if err == nil {
		err = takeError(C.peft_merge_buffer_options_set_threads(o, C.uint32_t(cfg.threads)))
	}
	if err == nil && cfg.translator != nil {
		var tp *C.peft_translator
		if tp, err = cfg.translator.use(); err == nil {
			err = takeError(C.peft_merge_buffer_options_set_translator(o, tp))
			cfg.translator.done()
		}
	}
	if err != nil {
		C.peft_merge_buffer_options_free(o)
		return nil, err
	}
	return o, nil
}

// cBias is a C copy of a bias buffer, large enough for whatever output dimension the library
// decides on: the C API takes the bias as a bare pointer whose length follows from the layer, so a
// bias of the wrong length must never be read or written out of bounds.
type cBias struct {
	ptr   unsafe.Pointer
	dst   []byte
	dtype DType
}

// newCBias copies bias into C memory padded to the largest length the weight's shape allows (the
// output dimension is the first or the second). A nil bias gives a NULL pointer.
func newCBias(bias *Buffer, weightShape []uint64) (cBias, error) {
	if bias == nil {
		return cBias{dtype: F32}, nil
	}
	if err := checkBiasDType(*bias); err != nil {
		return cBias{}, err
	}
	elem := uint64(bias.DType.Bits() / 8)
	room := uint64(len(bias.Data))
	for i := 0; i < len(weightShape) && i < 2; i++ {
		room = max(room, weightShape[i]*elem) // the weight's size was checked, so this cannot overflow
	}
	ptr := C.calloc(C.size_t(max(room, 1)), 1)
	if ptr == nil {
		return cBias{}, &Error{Code: CodeOutOfMemory, Message: "no memory for a copy of the bias"}
	}
	if len(bias.Data) > 0 {
		C.memcpy(ptr, unsafe.Pointer(&bias.Data[0]), C.size_t(len(bias.Data)))
	}
	return cBias{ptr: ptr, dst: bias.Data, dtype: bias.DType}, nil
}

func (c cBias) free() {
	if c.ptr != nil {
		C.free(c.ptr)
	}
}

func (c cBias) copyBack() {
	if c.ptr != nil && len(c.dst) > 0 {
		copy(c.dst, unsafe.Slice((*byte)(c.ptr), len(c.dst)))
	}
}

func checkBiasDType(bias Buffer) error {
	if bias.DType != F32 && bias.DType != BF16 && bias.DType != F16 {
		return &Error{Code: CodeUnsupported, Message: "bias dtype " + bias.DType.String() + " is not supported (F32, BF16 and F16 are)"}
	}
	if len(bias.Data)%(bias.DType.Bits()/8) != 0 {
		return argError("the bias holds %d bytes, not whole %s elements", len(bias.Data), bias.DType)
	}
	return nil
}

func checkBiasLength(bias Buffer, want uint64, layer string) error {
	have := uint64(len(bias.Data) / (bias.DType.Bits() / 8))
	if have != want {
		return &Error{Code: CodeShapeMismatch, Message: "the bias given for layer " + layer + " has " +
			strconv.FormatUint(have, 10) + " elements; its lora_B.bias has " + strconv.FormatUint(want, 10)}
	}
	return nil
}

// findLoraBiasLength finds the module a layer name designates, as the library resolves it (a module
// path or a tensor name, with or without "base_model.model.", or a native name through a
// translator), and returns the length of its lora_B.bias; ok is false when it cannot tell.
func (a *Adapter) findLoraBiasLength(p *C.peft_adapter, name string, tr *Translator) (uint64, bool) {
	if tr != nil {
		hf, err := tr.ToHF(name, false)
		if err != nil {
			return 0, false
		}
		name = hf
	}
	name = strings.TrimPrefix(name, "base_model.model.")
	for _, cand := range []string{name, strings.TrimSuffix(name, ".weight")} {
		if n, ok := loraBiasLength(p, cand); ok {
			return n, true
		}
	}
	return 0, false
}

// loraBiasLength returns the length of the lora_B.bias of module `module`; ok is false when there is
// no such module. A module without lora_B.bias gives 0 (a given bias is then left alone).
func loraBiasLength(p *C.peft_adapter, module string) (uint64, bool) {
	var cs cstrings
	defer cs.free()
	cname, err := cs.add(module, "module name")
	if err != nil {
		return 0, false
	}
	var index C.size_t
	if e := C.peft_adapter_find_module(p, cname, &index); e != nil {
		C.peft_error_free(e)
		return 0, false
	}
	m, err := moduleInfo(p, int(index))
	if err != nil {
		return 0, false
	}
	for _, t := range m.Tensors {
		if t.Role == "lora_B.bias" && len(t.Shape) == 1 {
			return t.Shape[0], true
		}
	}
	return 0, false
}

// Close releases the record without touching any buffer (the merge stays). Idempotent; returns nil.
func (r *MergeRecord) Close() error {
	if r == nil {
		return nil
	}
	r.h.close()
	return nil
}

func (r *MergeRecord) use() (*C.peft_merge_record, error) {
	p, err := r.h.acquireExclusive()
	return (*C.peft_merge_record)(p), err
}

func (r *MergeRecord) done() {
	r.h.releaseExclusive()
	runtime.KeepAlive(r)
}

// Module is the adapter module the record merged (its HuggingFace path); "" after Close.
func (r *MergeRecord) Module() string {
	p, err := r.use()
	if err != nil {
		return ""
	}
	defer r.done()
	return goString(C.peft_merge_record_module(p))
}

// Active reports whether the merge is still in the buffer (not removed yet).
func (r *MergeRecord) Active() bool {
	p, err := r.use()
	if err != nil {
		return false
	}
	defer r.done()
	return C.peft_merge_record_active(p) != 0
}

// SavedBytes is the number of bytes of original rows the record keeps for an exact removal.
func (r *MergeRecord) SavedBytes() uint64 {
	p, err := r.use()
	if err != nil {
		return 0
	}
	defer r.done()
	return uint64(C.peft_merge_record_saved_bytes(p))
}

// Remove takes the merge out of the buffers again (which may have moved, but must hold the same
// dtype and shape as when merged, and the bias if one was given). With original rows kept the rows
// are restored bit for bit, after checking that they still hold what the merge wrote (with several
// merges on one buffer, remove them in reverse order); otherwise PEFT's arithmetic unmerge is
// applied. On failure nothing is changed; on success the record is spent.
func (r *MergeRecord) Remove(weight Buffer, bias *Buffer) error {
	if err := weight.check("weight buffer"); err != nil {
		return err
	}
	if weight.DType != r.weightDType || !slices.Equal(weight.Shape, r.weightShape) {
		return argError("the weight buffer is %s %v; the merge was into %s %v", weight.DType, weight.Shape, r.weightDType, r.weightShape)
	}
	if bias != nil && r.biasBytes >= 0 && (bias.DType != r.biasDType || len(bias.Data) != r.biasBytes) {
		return argError("the bias buffer is %d bytes of %s; the merge had %d bytes of %s", len(bias.Data), bias.DType, r.biasBytes, r.biasDType)
	}
	p, err := r.use()
	if err != nil {
		return err
	}
	defer r.done()
	cb, err := newCBias(bias, weight.Shape)
	if err != nil {
		return err
	}
	defer cb.free()
	err = takeError(C.peft_merge_record_unmerge(p, bytePtr(weight.Data), cb.ptr))
	runtime.KeepAlive(weight.Data)
	if err != nil {
		return err
	}
	cb.copyBack()
	return nil
}
