package peft

/*
#include <stdint.h>
#include <peft_c.h>
peft_error* peftc_write_from_source(peft_writer* w, const char* name, int32_t src_dtype, uintptr_t handle);
*/
import "C"

import (
	"io"
	"runtime"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// Writer writes one .safetensors file (NewWriter) or a checkpoint folder (NewCheckpointWriter),
// byte-identical to what the reference safetensors writer produces for the same tensors.
//
// A write has three phases: declare every tensor (AddTensor) and the metadata; stream each tensor's
// bytes in the writer's order (Order, after Start), each with WriteTensor, BeginTensor + Write,
// WriteFrom or WriteFromCheckpoint; then Finish. The output is atomic: it appears at its path only
// when Finish succeeds. Closing an unfinished writer discards its output.
//
// A Writer belongs to one goroutine at a time: a call made while another is running fails with
// ErrBusy.
type Writer struct {
	h    handle
	next int // position (in the writer's order) of the next tensor to begin; guarded by h.busy
}

// NewWriter creates a writer of one .safetensors file at path (whose folder must exist when writing
// starts). The file starts without a __metadata__ entry.
func NewWriter(path string) (*Writer, error) {
	var cs cstrings
	defer cs.free()
	cpath, err := cs.add(path, "path")
	if err != nil {
		return nil, err
	}
	var out *C.peft_writer
	if err := takeError(C.peft_writer_new(cpath, &out)); err != nil {
		return nil, err
	}
	return newWriter(out), nil
}

// NewCheckpointWriter creates a writer of a checkpoint folder laid out as transformers'
// save_pretrained does: shards of at most maxShardSize bytes of tensor data (0 for no limit) named
// model-0000K-of-0000N.safetensors with model.safetensors.index.json, or one model.safetensors. The
// metadata starts as {"format": "pt"}.
func NewCheckpointWriter(folder string, maxShardSize uint64) (*Writer, error) {
	var cs cstrings
	defer cs.free()
	cfolder, err := cs.add(folder, "folder")
	if err != nil {
		return nil, err
	}
	var out *C.peft_writer
	if err := takeError(C.peft_writer_new_checkpoint(cfolder, C.uint64_t(maxShardSize), &out)); err != nil {
		return nil, err
	}
	return newWriter(out), nil
}

func newWriter(p *C.peft_writer) *Writer {
	w := &Writer{}
	track(w, &w.h, unsafe.Pointer(p), "Writer", freeWriter)
	return w
}

func freeWriter(p unsafe.Pointer) { C.peft_writer_free((*C.peft_writer)(p)) }

// Close releases the writer; an unfinished output is discarded (the target keeps its old content).
// Idempotent; always returns nil.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	w.h.close()
	return nil
}

func (w *Writer) use() (*C.peft_writer, error) {
	p, err := w.h.acquireExclusive()
	return (*C.peft_writer)(p), err
}

func (w *Writer) done() {
	w.h.releaseExclusive()
	runtime.KeepAlive(w)
}

// call runs one fallible C call with the writer's pointer and the C copies of some strings.
func (w *Writer) call(strs []string, what []string, fn func(p *C.peft_writer, s []*C.char) *C.peft_error) error {
	var cs cstrings
	defer cs.free()
	cstrs := make([]*C.char, len(strs))
	for i, s := range strs {
		var err error
		if cstrs[i], err = cs.add(s, what[i]); err != nil {
			return err
		}
	}
	p, err := w.use()
	if err != nil {
		return err
	}
	defer w.done()
	return takeError(fn(p, cstrs))
}

// AddTensor declares a tensor: its name (UTF-8, not "__metadata__", not declared before; it may
// hold NUL bytes), dtype in the file and shape (none for a scalar).
func (w *Writer) AddTensor(name string, dtype DType, shape ...uint64) error {
	var shapePtr *C.uint64_t
	if len(shape) > 0 {
		shapePtr = (*C.uint64_t)(unsafe.Pointer(&shape[0]))
	}
	var cs cstrings
	defer cs.free()
	cname := cs.addBytes(name)
	return w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error {
		return C.peft_writer_add_tensor_n(p, cname, C.size_t(len(name)), C.int32_t(dtype), shapePtr, C.size_t(len(shape)))
	})
}

// writeCall runs a call that begins the next tensor: name must be that tensor's. A name holding NUL
// bytes cannot travel as a C string, so the binding checks it against the writer's order itself and
// passes NULL ("the next tensor"). A successful call moves on to the following tensor.
func (w *Writer) writeCall(name string, fn func(p *C.peft_writer, cname *C.char) *C.peft_error) error {
	var cs cstrings
	defer cs.free()
	p, err := w.use()
	if err != nil {
		return err
	}
	defer w.done()
	var cname *C.char
	if strings.IndexByte(name, 0) < 0 {
		cname = C.CString(name)
		cs.list = append(cs.list, cname)
	} else {
		if err := takeError(C.peft_writer_start(p)); err != nil {
			return err
		}
		next := positionName(p, w.next)
		if w.next >= int(C.peft_writer_tensor_count(p)) || next != name {
			return argError("tensor %q is not the next one to write (that is %q)", name, next)
		}
	}
	if err := takeError(fn(p, cname)); err != nil {
		return err
	}
	w.next++
	return nil
}

// positionName is the full name (NUL bytes included) of the tensor at a position of a started writer.
func positionName(p *C.peft_writer, position int) string {
	s := C.peft_writer_tensor_name(p, C.size_t(position))
	if s == nil {
		return ""
	}
	return C.GoStringN(s, C.int(C.peft_writer_tensor_name_length(p, C.size_t(position))))
}

// SetMetadataPresent chooses whether the file has a __metadata__ entry at all: false removes it and
// every key set so far; true makes it present (empty unless keys are set).
func (w *Writer) SetMetadataPresent(present bool) error {
	return w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error {
		return C.peft_writer_set_metadata_present(p, boolInt(present))
	})
}

// SetMetadata sets a __metadata__ entry (replacing an earlier value of the key).
func (w *Writer) SetMetadata(key, value string) error {
	return w.call([]string{key, value}, []string{"metadata key", "metadata value"}, func(p *C.peft_writer, s []*C.char) *C.peft_error {
		return C.peft_writer_set_metadata(p, s[0], s[1])
	})
}

// BreakShard makes the next declared tensor start a new shard (checkpoint writers only).
func (w *Writer) BreakShard() error {
	return w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error { return C.peft_writer_break_shard(p) })
}

// SetIndexMetadataJSON adds entries to the index's "metadata" object (checkpoint writers only), e.g.
// the source index's metadata from Checkpoint.IndexMetadataJSON. total_size is always computed.
func (w *Writer) SetIndexMetadataJSON(jsonObject string) error {
	return w.call([]string{jsonObject}, []string{"index metadata"}, func(p *C.peft_writer, s []*C.char) *C.peft_error {
		return C.peft_writer_set_index_metadata_json(p, s[0])
	})
}

// Start ends the declarations and computes the headers; Order then tells the writing order. The
// first write and Finish call it when it was not called before.
func (w *Writer) Start() error {
	return w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error { return C.peft_writer_start(p) })
}

// TensorCount is the number of declared tensors (0 after Close or while another call runs).
func (w *Writer) TensorCount() int {
	p, err := w.use()
	if err != nil {
		return 0
	}
	defer w.done()
	return int(C.peft_writer_tensor_count(p))
}

// WriteOrder describes the writing order of a started writer.
type WriteOrder struct {
	Names        []string // tensor names in the order they must be written
	Declarations []int    // for each, its position in AddTensor order
	Files        []string // output files (for a checkpoint, the shards; the index is not listed)
}

// Order starts the writer if needed and returns the order in which tensors must be written.
func (w *Writer) Order() (WriteOrder, error) {
	p, err := w.use()
	if err != nil {
		return WriteOrder{}, err
	}
	defer w.done()
	if err := takeError(C.peft_writer_start(p)); err != nil {
		return WriteOrder{}, err
	}
	n := int(C.peft_writer_tensor_count(p))
	order := WriteOrder{Names: make([]string, n), Declarations: make([]int, n)}
	for i := 0; i < n; i++ {
		order.Names[i] = positionName(p, i)
		order.Declarations[i] = int(C.peft_writer_tensor_declaration(p, C.size_t(i)))
	}
	files := int(C.peft_writer_file_count(p))
	order.Files = make([]string, files)
	for i := range order.Files {
		order.Files[i] = goString(C.peft_writer_file_path(p, C.size_t(i)))
	}
	return order, nil
}

// WriteTensor writes the next tensor whole: data holds its bytes in srcType (the declared dtype, or
// one to convert from).
func (w *Writer) WriteTensor(name string, srcType DType, data []byte) error {
	return w.writeCall(name, func(p *C.peft_writer, cname *C.char) *C.peft_error {
		return C.peft_writer_write_tensor(p, cname, C.int32_t(srcType), bytePtr(data), C.uint64_t(len(data)))
	})
}

// BeginTensor begins the next tensor, whose bytes (in srcType) then come through Write.
func (w *Writer) BeginTensor(name string, srcType DType) error {
	return w.writeCall(name, func(p *C.peft_writer, cname *C.char) *C.peft_error {
		return C.peft_writer_begin_tensor(p, cname, C.int32_t(srcType))
	})
}

// Write appends bytes of the tensor begun with BeginTensor (io.Writer): any number up to what the
// tensor has left, whole elements when converting. It writes all of p or nothing.
func (w *Writer) Write(data []byte) (int, error) {
	err := w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error {
		return C.peft_writer_write(p, bytePtr(data), C.uint64_t(len(data)))
	})
	if err != nil {
		return 0, err
	}
	return len(data), nil
}

// sourceState is what the tensor-source trampoline reaches through its cgo.Handle.
type sourceState struct {
	fill     func(offset uint64, dst []byte) error
	err      error
	panicked bool
	panicVal any
}

// WriteFrom writes the next tensor whole from a function that fills chunks: it is called with
// increasing, contiguous offsets (into the tensor's bytes in srcType) and a buffer to fill
// completely (at most 4 MiB, whole elements when converting), valid only during the call. An error
// from fill stops the write, discards the output, and is returned (wrapped in an ErrCancelled
// error that unwraps to it). A panic in fill discards the output and is re-raised here. fill must
// not call the Writer.
func (w *Writer) WriteFrom(name string, srcType DType, fill func(offset uint64, dst []byte) error) error {
	state := &sourceState{fill: fill}
	h := cgo.NewHandle(state)
	defer h.Delete()
	err := w.writeCall(name, func(p *C.peft_writer, cname *C.char) *C.peft_error {
		return C.peftc_write_from_source(p, cname, C.int32_t(srcType), C.uintptr_t(h))
	})
	if state.panicked {
		panic(state.panicVal)
	}
	if state.err != nil {
		if e, ok := err.(*Error); ok {
			e.cause = state.err
		}
	}
	return err
}

// WriteFromReader writes the next tensor whole from r, which must give exactly the tensor's bytes
// in srcType (io.ErrUnexpectedEOF when it ends early).
func (w *Writer) WriteFromReader(name string, srcType DType, r io.Reader) error {
	return w.WriteFrom(name, srcType, func(_ uint64, dst []byte) error {
		_, err := io.ReadFull(r, dst)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	})
}

// WriteFromCheckpoint writes the next tensor from tensor `index` of an opened checkpoint, streamed
// in chunks and converted when the declared dtype differs. The shapes must be equal.
func (w *Writer) WriteFromCheckpoint(name string, ckpt *Checkpoint, index int) error {
	if index < 0 {
		return argError("tensor index %d is out of range", index)
	}
	cp, err := ckpt.use()
	if err != nil {
		return err
	}
	defer ckpt.done()
	return w.writeCall(name, func(p *C.peft_writer, cname *C.char) *C.peft_error {
		return C.peft_writer_write_from_checkpoint(p, cname, cp, C.size_t(index))
	})
}

// Finish completes the output: it checks that every tensor was written, flushes and renames the
// files into place (a checkpoint's index last). A missing tensor is an ErrInvalidArgument error that
// changes nothing (write it and finish again).
func (w *Writer) Finish() error {
	return w.call(nil, nil, func(p *C.peft_writer, _ []*C.char) *C.peft_error { return C.peft_writer_finish(p) })
}

// SaveFile writes tensors to a .safetensors file in one call, as safetensors' save_file does (the
// file's order is the reference's: dtype, then name). Each tensor's Data must be in its DType.
// metadata may be nil (no __metadata__ entry).
func SaveFile(path string, tensors []TensorData, metadata map[string]string) error {
	w, err := NewWriter(path)
	if err != nil {
		return err
	}
	defer w.Close()
	byName := make(map[string]*TensorData, len(tensors))
	for i := range tensors {
		t := &tensors[i]
		if err := w.AddTensor(t.Name, t.DType, t.Shape...); err != nil {
			return err
		}
		byName[t.Name] = t
	}
	if metadata != nil {
		if err := w.SetMetadataPresent(true); err != nil {
			return err
		}
	}
	for k, v := range metadata {
		if err := w.SetMetadata(k, v); err != nil {
			return err
		}
	}
	order, err := w.Order()
	if err != nil {
		return err
	}
	for _, name := range order.Names {
		t := byName[name]
		if err := w.WriteTensor(name, t.DType, t.Data); err != nil {
			return err
		}
	}
	return w.Finish()
}

// TensorData is a tensor held in Go memory, for SaveFile.
type TensorData struct {
	Name  string
	DType DType
	Shape []uint64
	Data  []byte // little-endian, row-major bytes in DType
}
