package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Checkpoint is an opened, fully validated safetensors or GGUF file or checkpoint folder (see
// FileFormat and GGUFMetadata for what only GGUF files have). It is read-only:
// every method may be called from many goroutines at once. Close releases the file mapping.
type Checkpoint struct {
	h handle
}

// TensorInfo describes one tensor of a checkpoint.
type TensorInfo struct {
	Index       int       // position in the checkpoint: file by file, each file in data order
	Name        string    // the tensor's name
	DType       DType     // its element type; -1 (not Valid) for a block-quantized GGUF tensor
	Shape       []uint64  // its dimensions (empty for a scalar)
	DataOffsets [2]uint64 // byte range [begin, end) in its file's data section
	File        int       // which file holds it (0 .. FileCount-1)
	GGMLType    GGMLType  // its ggml type as its GGUF file stores it; -1 in a safetensors file
}

// NumBytes is the size of the tensor's bytes in the file.
func (t TensorInfo) NumBytes() uint64 { return t.DataOffsets[1] - t.DataOffsets[0] }

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() uint64 {
	n, _ := elementCount(t.Shape) // the library validated the shape when it opened the file
	return n
}

// OpenOption sets an option of Open and OpenBytes.
type OpenOption func(*openConfig)

type openConfig struct {
	maxHeader    uint64
	setMaxHeader bool
	pread        bool
}

// WithMaxHeaderSize sets the largest header length accepted (ErrHeaderTooLarge above it); the
// default is 100,000,000 bytes, as in the reference.
func WithMaxHeaderSize(bytes uint64) OpenOption {
	return func(c *openConfig) { c.maxHeader, c.setMaxHeader = bytes, true }
}

// WithPread makes View return private copies read with pread instead of slices of a mapping of the
// file: each tensor is read when it is first viewed and kept until Close. Read and everything else
// read with pread either way. It does not apply to OpenBytes.
func WithPread(use bool) OpenOption {
	return func(c *openConfig) { c.pread = use }
}

// newOpenOptions builds the C options (nil when every option has its default).
func newOpenOptions(opts []OpenOption) (*C.peft_open_options, error) {
	var cfg openConfig
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.setMaxHeader && !cfg.pread {
		return nil, nil
	}
	var o *C.peft_open_options
	if err := takeError(C.peft_open_options_new(&o)); err != nil {
		return nil, err
	}
	if cfg.setMaxHeader {
		if err := takeError(C.peft_open_options_set_max_header_size(o, C.uint64_t(cfg.maxHeader))); err != nil {
			C.peft_open_options_free(o)
			return nil, err
		}
	}
	if err := takeError(C.peft_open_options_set_use_pread(o, boolInt(cfg.pread))); err != nil {
		C.peft_open_options_free(o)
		return nil, err
	}
	return o, nil
}

// Open opens a .safetensors or GGUF file, or a folder holding model.safetensors.index.json and its shards
// or model.safetensors, and validates every header completely, as the reference reader does.
//
// Errors: the format codes (ErrHeaderTooSmall .. ErrMetadataIncompleteBuffer) for a damaged file,
// ErrIO when a file cannot be read, ErrInvalidCheckpoint for a wrong index or folder.
func Open(path string, opts ...OpenOption) (*Checkpoint, error) {
	var cs cstrings
	defer cs.free()
	cpath, err := cs.add(path, "path")
	if err != nil {
		return nil, err
	}
	o, err := newOpenOptions(opts)
	if err != nil {
		return nil, err
	}
	defer C.peft_open_options_free(o)
	var out *C.peft_checkpoint
	if err := takeError(C.peft_checkpoint_open(cpath, o, &out)); err != nil {
		return nil, err
	}
	return newCheckpoint(out), nil
}

// OpenBytes validates a safetensors or GGUF file held in memory and opens it as a one-file checkpoint.
// The bytes are copied; data may be changed or dropped afterwards.
func OpenBytes(data []byte, opts ...OpenOption) (*Checkpoint, error) {
	o, err := newOpenOptions(opts)
	if err != nil {
		return nil, err
	}
	defer C.peft_open_options_free(o)
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	var out *C.peft_checkpoint
	if err := takeError(C.peft_checkpoint_open_memory(p, C.size_t(len(data)), o, &out)); err != nil {
		return nil, err
	}
	return newCheckpoint(out), nil
}

func newCheckpoint(p *C.peft_checkpoint) *Checkpoint {
	c := &Checkpoint{}
	track(c, &c.h, unsafe.Pointer(p), "Checkpoint", freeCheckpoint)
	return c
}

func freeCheckpoint(p unsafe.Pointer) { C.peft_checkpoint_free((*C.peft_checkpoint)(p)) }

// Close releases the checkpoint. It is idempotent and always returns nil. Views obtained from the
// checkpoint become invalid; calls made later fail with ErrClosed.
func (c *Checkpoint) Close() error {
	if c == nil {
		return nil
	}
	c.h.close()
	return nil
}

func (c *Checkpoint) use() (*C.peft_checkpoint, error) {
	p, err := c.h.acquire()
	return (*C.peft_checkpoint)(p), err
}

func (c *Checkpoint) done() {
	c.h.release()
	runtime.KeepAlive(c)
}

// TensorCount is the number of tensors (0 after Close).
func (c *Checkpoint) TensorCount() int {
	p, err := c.use()
	if err != nil {
		return 0
	}
	defer c.done()
	return int(C.peft_checkpoint_tensor_count(p))
}

// FileCount is the number of files: 1 for a single file, else the number of shards (0 after Close).
func (c *Checkpoint) FileCount() int {
	p, err := c.use()
	if err != nil {
		return 0
	}
	defer c.done()
	return int(C.peft_checkpoint_file_count(p))
}

// Files lists the paths of the checkpoint's files as opened (a folder joined with each shard name).
func (c *Checkpoint) Files() ([]string, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	n := C.peft_checkpoint_file_count(p)
	files := make([]string, n)
	for i := range files {
		files[i] = goString(C.peft_checkpoint_file_path(p, C.size_t(i)))
	}
	return files, nil
}

// Metadata returns the __metadata__ of file `file` (0 for a one-file checkpoint): nil when the file
// has no __metadata__ entry, an empty map when it has an empty one.
func (c *Checkpoint) Metadata(file int) (map[string]string, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	if file < 0 || file >= int(C.peft_checkpoint_file_count(p)) {
		return nil, argError("file index %d is out of range", file)
	}
	f := C.size_t(file)
	if C.peft_checkpoint_has_metadata(p, f) == 0 {
		return nil, nil
	}
	n := int(C.peft_checkpoint_metadata_count(p, f))
	m := make(map[string]string, n)
	for i := 0; i < n; i++ {
		m[goString(C.peft_checkpoint_metadata_key(p, f, C.size_t(i)))] = goString(C.peft_checkpoint_metadata_value(p, f, C.size_t(i)))
	}
	return m, nil
}

// IndexMetadataJSON returns the "metadata" object of the checkpoint's model.safetensors.index.json
// as compact JSON; ok is false when there is no index or it has no "metadata".
func (c *Checkpoint) IndexMetadataJSON() (json string, ok bool, err error) {
	p, err := c.use()
	if err != nil {
		return "", false, err
	}
	defer c.done()
	s := C.peft_checkpoint_index_metadata_json(p)
	if s == nil {
		return "", false, nil
	}
	return C.GoString(s), true, nil
}

// Find returns the index of the tensor with this exact name, or an ErrNotFound error. The name may
// hold NUL bytes (JSON can spell them, so safetensors names can contain them).
func (c *Checkpoint) Find(name string) (int, error) {
	var cs cstrings
	defer cs.free()
	cname := cs.addBytes(name)
	p, err := c.use()
	if err != nil {
		return -1, err
	}
	defer c.done()
	var index C.size_t
	if err := takeError(C.peft_checkpoint_find_n(p, cname, C.size_t(len(name)), &index)); err != nil {
		return -1, err
	}
	return int(index), nil
}

// Tensor describes tensor `index` (0 .. TensorCount-1).
func (c *Checkpoint) Tensor(index int) (TensorInfo, error) {
	p, err := c.use()
	if err != nil {
		return TensorInfo{}, err
	}
	defer c.done()
	return tensorInfo(p, index)
}

// TensorByName describes the tensor with this exact name (ErrNotFound if there is none).
func (c *Checkpoint) TensorByName(name string) (TensorInfo, error) {
	index, err := c.Find(name)
	if err != nil {
		return TensorInfo{}, err
	}
	return c.Tensor(index)
}

// Tensors describes every tensor, in index order.
func (c *Checkpoint) Tensors() ([]TensorInfo, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	infos := make([]TensorInfo, C.peft_checkpoint_tensor_count(p))
	for i := range infos {
		if infos[i], err = tensorInfo(p, i); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

func tensorInfo(p *C.peft_checkpoint, index int) (TensorInfo, error) {
	if index < 0 || index >= int(C.peft_checkpoint_tensor_count(p)) {
		return TensorInfo{}, argError("tensor index %d is out of range", index)
	}
	i := C.size_t(index)
	info := TensorInfo{
		Index:    index,
		Name:     C.GoStringN(C.peft_checkpoint_tensor_name(p, i), C.int(C.peft_checkpoint_tensor_name_length(p, i))),
		DType:    DType(C.peft_checkpoint_tensor_dtype(p, i)),
		Shape:    copyShape(C.peft_checkpoint_tensor_shape(p, i), C.peft_checkpoint_tensor_ndim(p, i)),
		File:     int(C.peft_checkpoint_tensor_file(p, i)),
		GGMLType: GGMLType(C.peft_checkpoint_tensor_ggml_type(p, i)),
	}
	var begin, end C.uint64_t
	if err := takeError(C.peft_checkpoint_tensor_offsets(p, i, &begin, &end)); err != nil {
		return TensorInfo{}, err
	}
	info.DataOffsets = [2]uint64{uint64(begin), uint64(end)}
	return info, nil
}

// copyShape copies a borrowed C shape array into Go memory (an empty, non-nil slice for a scalar).
func copyShape(shape *C.uint64_t, ndim C.size_t) []uint64 {
	out := make([]uint64, int(ndim))
	if ndim > 0 && shape != nil {
		for i, d := range unsafe.Slice(shape, int(ndim)) {
			out[i] = uint64(d)
		}
	}
	return out
}

// View returns the bytes of tensor `index` (little-endian, row-major) without copying them: the
// slice points into the checkpoint's file mapping (or, with WithPread, into a buffer the checkpoint
// keeps), memory that the C library owns.
//
// The view is valid only while the checkpoint is open: after Close, or once the *Checkpoint is
// unreachable and collected, using it is undefined behaviour (typically a crash). So keep the
// checkpoint reachable while you use the view, for example with a deferred Close or
// runtime.KeepAlive(ckpt) after the last use. The bytes must not be modified (a mapping is
// read-only). Copy them (bytes.Clone) to keep them beyond the checkpoint's life.
//
// View fails with CodeIO when the file was truncated or rewritten since Open. But a slice of the
// mapping reads the file directly: if the file is truncated while the slice is in use, touching the
// lost bytes raises SIGBUS, which the Go runtime turns into a fatal error, and bytes rewritten in
// place show through. Where files may change, use Read (CodeIO instead) or open WithPread(true).
//
// The alignment is whatever the file gives; files written by the reference writer or by peft_c
// align every tensor to its element size.
func (c *Checkpoint) View(index int) ([]byte, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	if index < 0 || index >= int(C.peft_checkpoint_tensor_count(p)) {
		return nil, argError("tensor index %d is out of range", index)
	}
	var data unsafe.Pointer
	var n C.uint64_t
	if err := takeError(C.peft_checkpoint_tensor_view(p, C.size_t(index), &data, &n)); err != nil {
		return nil, err
	}
	if n == 0 {
		return []byte{}, nil
	}
	return unsafe.Slice((*byte)(data), int(n)), nil
}

// ReadInto reads tensor `index` into dst, converting it to dtype (see Convert). dst must hold
// exactly the tensor's elements in dtype. On failure dst may have been partly written.
func (c *Checkpoint) ReadInto(index int, dtype DType, dst []byte) error {
	if index < 0 {
		return argError("tensor index %d is out of range", index)
	}
	p, err := c.use()
	if err != nil {
		return err
	}
	defer c.done()
	return takeError(C.peft_checkpoint_tensor_read(p, C.size_t(index), C.int32_t(dtype), bytePtr(dst), C.uint64_t(len(dst))))
}

// Read returns a converted copy of tensor `index` as dtype's bytes.
func (c *Checkpoint) Read(index int, dtype DType) ([]byte, error) {
	info, err := c.Tensor(index)
	if err != nil {
		return nil, err
	}
	size, err := dtype.byteSize(info.NumElements())
	if err != nil {
		return nil, err
	}
	dst := make([]byte, size)
	if err := c.ReadInto(index, dtype, dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// ReadFloat32 returns tensor `index` converted to float32 (F32 copied; F64 and the 16- and 8-bit
// floats rounded to nearest even; integers and Bool converted as by C).
func (c *Checkpoint) ReadFloat32(index int) ([]float32, error) {
	info, err := c.Tensor(index)
	if err != nil {
		return nil, err
	}
	out := make([]float32, info.NumElements())
	if err := c.ReadInto(index, F32, float32Bytes(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// ReadFloat64 returns tensor `index` converted to float64.
func (c *Checkpoint) ReadFloat64(index int) ([]float64, error) {
	info, err := c.Tensor(index)
	if err != nil {
		return nil, err
	}
	out := make([]float64, info.NumElements())
	if err := c.ReadInto(index, F64, float64Bytes(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// bytePtr is the address of a slice's first byte, or nil for an empty slice.
func bytePtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// float32Bytes views a float32 slice as its bytes (no copy).
func float32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*4)
}

// float64Bytes views a float64 slice as its bytes (no copy).
func float64Bytes(f []float64) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*8)
}

func boolInt(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
