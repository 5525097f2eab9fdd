// Control vectors (src/capi/control_api.cpp): ControlVector, one steering direction per decoder
// layer, read from and written to llama.cpp's GGUF or safetensors files, combined, and added to a
// host's buffer; ControlRecord, what taking an applied direction out again exactly needs.

package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// ControlVector holds one direction of NEmbd float32 values per decoder layer; a host adds
// strength x the direction of layer N to the output of its 0-based decoder layer N (the residual
// stream after the layer), as llama.cpp applies --control-vector.
//
// The reading methods (NEmbd, ModelHint, Layers, Direction, Save, Apply) may run concurrently;
// SetDirection and Add need the vector to themselves: one of them while any other call on the
// vector is running fails with ErrBusy, and so does a reading call while one of them runs.
type ControlVector struct {
	h  handle
	mu sync.RWMutex // read-locked by the reading calls, locked by the changing ones
}

func freeControlVector(p unsafe.Pointer) { C.peft_control_vector_free((*C.peft_control_vector)(p)) }

func newControlVector(p *C.peft_control_vector) *ControlVector {
	v := &ControlVector{}
	track(v, &v.h, unsafe.Pointer(p), "ControlVector", freeControlVector)
	return v
}

// OpenControlVector reads a control vector from one GGUF or safetensors file (the format is told by
// its contents), checking what llama.cpp's loader checks. Errors: ErrIO (and the format's errors)
// for a file that does not open; ErrInvalidCheckpoint for a file that is no control vector;
// ErrNonFinite for an infinite or NaN value.
func OpenControlVector(path string) (*ControlVector, error) {
	var cs cstrings
	defer cs.free()
	cpath, err := cs.add(path, "path")
	if err != nil {
		return nil, err
	}
	var out *C.peft_control_vector
	if err := takeError(C.peft_control_vector_open(cpath, &out)); err != nil {
		return nil, err
	}
	return newControlVector(out), nil
}

// NewControlVector makes an empty control vector of nEmbd values per direction (in [1, 2^31]), made
// for the model modelHint ("" for none), to be filled with SetDirection or Add.
func NewControlVector(nEmbd uint64, modelHint string) (*ControlVector, error) {
	var cs cstrings
	defer cs.free()
	chint, err := cs.addOptional(modelHint, "model hint")
	if err != nil {
		return nil, err
	}
	var out *C.peft_control_vector
	if err := takeError(C.peft_control_vector_new(C.uint64_t(nEmbd), chint, &out)); err != nil {
		return nil, err
	}
	return newControlVector(out), nil
}

// Close releases the vector (records of its applies stay usable). Idempotent; returns nil.
func (v *ControlVector) Close() error {
	if v == nil {
		return nil
	}
	v.h.close()
	return nil
}

// read starts a reading call: the C pointer, or ErrClosed, or ErrBusy while a changing call runs.
func (v *ControlVector) read() (*C.peft_control_vector, error) {
	if !v.mu.TryRLock() {
		if v.h.closed() {
			return nil, closedError{v.h.what}
		}
		return nil, busyError{v.h.what}
	}
	p, err := v.h.acquire()
	if err != nil {
		v.mu.RUnlock()
		return nil, err
	}
	return (*C.peft_control_vector)(p), nil
}

func (v *ControlVector) readDone() {
	v.h.release()
	v.mu.RUnlock()
	runtime.KeepAlive(v)
}

// write starts a changing call: the C pointer, or ErrClosed, or ErrBusy while any other call runs.
func (v *ControlVector) write() (*C.peft_control_vector, error) {
	if !v.mu.TryLock() {
		if v.h.closed() {
			return nil, closedError{v.h.what}
		}
		return nil, busyError{v.h.what}
	}
	p, err := v.h.acquire()
	if err != nil {
		v.mu.Unlock()
		return nil, err
	}
	return (*C.peft_control_vector)(p), nil
}

func (v *ControlVector) writeDone() {
	v.h.release()
	v.mu.Unlock()
	runtime.KeepAlive(v)
}

// NEmbd is the number of values per direction (the model's hidden size); 0 after Close.
func (v *ControlVector) NEmbd() uint64 {
	p, err := v.read()
	if err != nil {
		return 0
	}
	defer v.readDone()
	return uint64(C.peft_control_vector_n_embd(p))
}

// ModelHint is the model the vector was made for, as its file names it ("" when none or after Close).
func (v *ControlVector) ModelHint() string {
	p, err := v.read()
	if err != nil {
		return ""
	}
	defer v.readDone()
	return goString(C.peft_control_vector_model_hint(p))
}

// LayerCount is the number of layers that have a direction; 0 after Close.
func (v *ControlVector) LayerCount() int {
	p, err := v.read()
	if err != nil {
		return 0
	}
	defer v.readDone()
	return int(C.peft_control_vector_layer_count(p))
}

// Layer is the layer of the index-th direction, layers in ascending order; -1 when index is out of
// range (or after Close).
func (v *ControlVector) Layer(index int) int64 {
	if index < 0 {
		return -1
	}
	p, err := v.read()
	if err != nil {
		return -1
	}
	defer v.readDone()
	return int64(C.peft_control_vector_layer(p, C.size_t(index)))
}

// Layers returns the layers that have a direction, ascending (never nil; empty after Close).
func (v *ControlVector) Layers() []int64 {
	p, err := v.read()
	if err != nil {
		return []int64{}
	}
	defer v.readDone()
	n := int(C.peft_control_vector_layer_count(p))
	layers := make([]int64, 0, n)
	for i := 0; i < n; i++ {
		layers = append(layers, int64(C.peft_control_vector_layer(p, C.size_t(i))))
	}
	return layers
}

// Direction returns a copy of one layer's direction (NEmbd values), or nil for a layer without one
// (or after Close).
func (v *ControlVector) Direction(layer int64) []float32 {
	p, err := v.read()
	if err != nil {
		return nil
	}
	defer v.readDone()
	d := C.peft_control_vector_direction(p, C.int64_t(layer))
	if d == nil {
		return nil
	}
	n := int(C.peft_control_vector_n_embd(p))
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(d)), n)...)
}

// SetDirection sets one layer's direction (layer >= 0) to NEmbd float32 values, replacing what the
// layer had. On failure the vector is unchanged: ErrInvalidArgument for a negative layer or a slice
// of another length, ErrNonFinite for an infinite or NaN value.
func (v *ControlVector) SetDirection(layer int64, values []float32) error {
	return v.SetDirectionBytes(layer, F32, float32Bytes(values))
}

// SetDirectionBytes is SetDirection from the raw bytes of NEmbd elements of dtype (F32, BF16, F16 or
// F64, little-endian), converted to float32.
func (v *ControlVector) SetDirectionBytes(layer int64, dtype DType, data []byte) error {
	p, err := v.write()
	if err != nil {
		return err
	}
	defer v.writeDone()
	if dtype != F32 && dtype != BF16 && dtype != F16 && dtype != F64 {
		return argError("direction dtype %s is not supported (F32, BF16, F16 and F64 are)", dtype)
	}
	n := uint64(C.peft_control_vector_n_embd(p))
	size, err := dtype.byteSize(n)
	if err != nil {
		return err
	}
	if uint64(len(data)) != size {
		return argError("a direction is %d elements (%d bytes of %s); %d bytes were given", n, size, dtype, len(data))
	}
	err = takeError(C.peft_control_vector_set_direction(p, C.int64_t(layer), C.int32_t(dtype), bytePtr(data)))
	runtime.KeepAlive(data)
	return err
}

// Add adds strength x src to v, layer by layer (a layer v lacks starts at zero), with llama.cpp's
// arithmetic when it loads several vectors: each element src * float32(strength) in float32, then
// added in float32. src may be v itself. On failure v is unchanged: ErrShapeMismatch when the
// NEmbd differ, ErrNonFinite when a sum is infinite or NaN.
func (v *ControlVector) Add(src *ControlVector, strength float64) error {
	if src == nil {
		return argError("the control vector to add is nil")
	}
	p, err := v.write()
	if err != nil {
		return err
	}
	defer v.writeDone()
	sp := p
	if src != v {
		if sp, err = src.read(); err != nil {
			return err
		}
		defer src.readDone()
	}
	return takeError(C.peft_control_vector_add(p, sp, C.double(strength)))
}

// Save writes the vector to path, atomically: FormatGGUF as llama.cpp's layout (as repeng's
// export_gguf writes it), FormatSafetensors as direction.N float32 tensors. Errors:
// ErrInvalidArgument for a vector without directions, another format, or (GGUF) a direction for
// layer 0, which llama.cpp refuses; ErrIO when the file cannot be written.
func (v *ControlVector) Save(path string, format FileFormat) error {
	var cs cstrings
	defer cs.free()
	cpath, err := cs.add(path, "path")
	if err != nil {
		return err
	}
	p, err := v.read()
	if err != nil {
		return err
	}
	defer v.readDone()
	return takeError(C.peft_control_vector_save(p, cpath, C.int32_t(format)))
}

// Apply adds layer's direction x strength to the host's buffer, in place: to each row of NEmbd
// elements, y = round(x + d * float32(strength)), the product and the sum in float32 as llama.cpp
// computes them, rounded once to the buffer's dtype (F32, BF16 or F16). buf holds whole rows
// (activations [rows, NEmbd], or a bias [1, NEmbd]); its Shape, when given, must match its Data. A
// layer without a direction leaves the buffer as it is. The record takes the direction out again
// exactly (ControlRecord.Remove); it keeps twice the buffer's bytes until closed. On failure the
// buffer is unchanged: ErrNonFinite when a finite element would become infinite or NaN.
func (v *ControlVector) Apply(layer int64, strength float64, buf Buffer) (*ControlRecord, error) {
	var rec *C.peft_control_record
	if err := v.apply(layer, strength, buf, &rec); err != nil {
		return nil, err
	}
	r := &ControlRecord{dtype: buf.DType, nbytes: len(buf.Data)}
	track(r, &r.h, unsafe.Pointer(rec), "ControlRecord", freeControlRecord)
	return r, nil
}

// ApplyWithoutRecord is Apply without a record (nothing kept; the direction cannot be taken out
// exactly afterwards).
func (v *ControlVector) ApplyWithoutRecord(layer int64, strength float64, buf Buffer) error {
	return v.apply(layer, strength, buf, nil)
}

func (v *ControlVector) apply(layer int64, strength float64, buf Buffer, out **C.peft_control_record) error {
	if buf.DType != F32 && buf.DType != BF16 && buf.DType != F16 {
		return &Error{Code: CodeUnsupported, Message: "buffer dtype " + buf.DType.String() + " is not supported (F32, BF16 and F16 are)"}
	}
	if len(buf.Shape) > 0 {
		if err := buf.check("buffer"); err != nil {
			return err
		}
	}
	p, err := v.read()
	if err != nil {
		return err
	}
	defer v.readDone()
	n := uint64(C.peft_control_vector_n_embd(p))
	rowBytes, err := buf.DType.byteSize(n)
	if err != nil {
		return err
	}
	if len(buf.Data) == 0 || uint64(len(buf.Data))%rowBytes != 0 {
		return argError("the buffer holds %d bytes, not a whole nonzero number of rows of %d %s elements", len(buf.Data), n, buf.DType)
	}
	rows := uint64(len(buf.Data)) / rowBytes
	err = takeError(C.peft_control_vector_apply(p, C.int64_t(layer), C.double(strength), bytePtr(buf.Data),
		C.int32_t(buf.DType), C.uint64_t(rows), out))
	runtime.KeepAlive(buf.Data)
	return err
}

// ControlRecord is a direction applied to a buffer by ControlVector.Apply, and what taking it out
// exactly needs. It belongs to one goroutine at a time. Closing it leaves the buffer as it is.
type ControlRecord struct {
	h      handle
	dtype  DType
	nbytes int
}

func freeControlRecord(p unsafe.Pointer) { C.peft_control_record_free((*C.peft_control_record)(p)) }

// Close releases the record without touching any buffer. Idempotent; returns nil.
func (r *ControlRecord) Close() error {
	if r == nil {
		return nil
	}
	r.h.close()
	return nil
}

// Remove takes the applied direction out of the buffer again, exactly: it puts back the bytes the
// buffer held before, after checking that it still holds what the apply wrote (the buffer may have
// moved; with several applies on one buffer, remove them in reverse order). On failure nothing is
// changed (ErrInvalidArgument for a buffer that changed since the apply, or a spent record); on
// success the record is spent.
func (r *ControlRecord) Remove(buf Buffer) error {
	if buf.DType != r.dtype || len(buf.Data) != r.nbytes {
		return argError("the buffer is %d bytes of %s; the apply was to %d bytes of %s", len(buf.Data), buf.DType, r.nbytes, r.dtype)
	}
	p, err := r.h.acquireExclusive()
	if err != nil {
		return err
	}
	defer func() {
		r.h.releaseExclusive()
		runtime.KeepAlive(r)
	}()
	err = takeError(C.peft_control_record_remove((*C.peft_control_record)(p), bytePtr(buf.Data)))
	runtime.KeepAlive(buf.Data)
	return err
}
