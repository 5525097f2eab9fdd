package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"strconv"
	"unsafe"
)

// FileFormat is the format of one file of a checkpoint (the PEFT_FORMAT_* values).
type FileFormat int32

// The file formats.
const (
	FormatSafetensors FileFormat = C.PEFT_FORMAT_SAFETENSORS
	FormatGGUF        FileFormat = C.PEFT_FORMAT_GGUF
)

// String is "safetensors" or "gguf"; "FileFormat(N)" for another value.
func (f FileFormat) String() string {
	switch f {
	case FormatSafetensors:
		return "safetensors"
	case FormatGGUF:
		return "gguf"
	}
	return "FileFormat(" + strconv.Itoa(int(f)) + ")"
}

// GGUFType is the type of a GGUF metadata value (the PEFT_GGUF_* values, gguf.h's numbering).
type GGUFType int32

// The GGUF metadata value types.
const (
	GGUFU8     GGUFType = C.PEFT_GGUF_U8
	GGUFI8     GGUFType = C.PEFT_GGUF_I8
	GGUFU16    GGUFType = C.PEFT_GGUF_U16
	GGUFI16    GGUFType = C.PEFT_GGUF_I16
	GGUFU32    GGUFType = C.PEFT_GGUF_U32
	GGUFI32    GGUFType = C.PEFT_GGUF_I32
	GGUFF32    GGUFType = C.PEFT_GGUF_F32
	GGUFBool   GGUFType = C.PEFT_GGUF_BOOL
	GGUFString GGUFType = C.PEFT_GGUF_STRING
	GGUFArray  GGUFType = C.PEFT_GGUF_ARRAY
	GGUFU64    GGUFType = C.PEFT_GGUF_U64
	GGUFI64    GGUFType = C.PEFT_GGUF_I64
	GGUFF64    GGUFType = C.PEFT_GGUF_F64
)

var ggufTypeNames = [...]string{"U8", "I8", "U16", "I16", "U32", "I32", "F32", "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"}

// String is the type's name as gguf.h spells it without its prefix ("U32", "ARRAY"); "GGUFType(N)"
// for another value.
func (t GGUFType) String() string {
	if t >= 0 && int(t) < len(ggufTypeNames) {
		return ggufTypeNames[t]
	}
	return "GGUFType(" + strconv.Itoa(int(t)) + ")"
}

// GGMLType is the storage type of a tensor in a GGUF file, in ggml's numbering (0 F32, 1 F16,
// 8 Q8_0, 12 Q4_K, 30 BF16, ...). TensorInfo.GGMLType is -1 for a tensor of a safetensors file.
type GGMLType int32

// String is the name as gguf-py spells it ("Q4_K"); "GGMLType(N)" for a number ggml does not define.
func (t GGMLType) String() string {
	if p := C.peft_ggml_type_name(C.int32_t(t)); p != nil {
		return C.GoString(p)
	}
	return "GGMLType(" + strconv.Itoa(int(t)) + ")"
}

// Valid reports whether ggml defines t.
func (t GGMLType) Valid() bool { return C.peft_ggml_type_name(C.int32_t(t)) != nil }

// Geometry returns how t stores a row: n elements (a multiple of blockSize) take n / blockSize
// blocks of typeSize bytes (1 and 4 for F32, 32 and 34 for Q8_0). ErrInvalidArgument for a type
// ggml does not define.
func (t GGMLType) Geometry() (blockSize, typeSize uint32, err error) {
	var block, size C.uint32_t
	if err := takeError(C.peft_ggml_type_geometry(C.int32_t(t), &block, &size)); err != nil {
		return 0, 0, err
	}
	return uint32(block), uint32(size), nil
}

// ParseGGMLType returns the ggml type of an exact name ("BF16", "Q8_0"), or an ErrInvalidArgument
// error.
func ParseGGMLType(name string) (GGMLType, error) {
	var cs cstrings
	defer cs.free()
	p, err := cs.add(name, "ggml type name")
	if err != nil {
		return -1, err
	}
	t := C.peft_ggml_type_from_name(p)
	if t < 0 {
		return -1, argError("%q is not a ggml type", name)
	}
	return GGMLType(t), nil
}

// GGUFValue is one GGUF metadata value, copied out of the checkpoint. Type says how the file stores
// it; an array (Type GGUFArray) has elements of ElemType, read with Len and Index. The getters
// report false for a value of another type.
type GGUFValue struct {
	Type     GGUFType // the stored type
	ElemType GGUFType // for an array, its elements' type; -1 otherwise
	scalar   any      // uint64 (U8 .. U64), int64 (I8 .. I64), float64, bool or string
	items    []GGUFValue
}

// GGUFEntry is one metadata key/value of a GGUF file.
type GGUFEntry struct {
	Key   string
	Value GGUFValue
}

// Int returns an integer value (any of U8 .. I64) that fits int64.
func (v GGUFValue) Int() (int64, bool) {
	switch x := v.scalar.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), x <= 1<<63-1
	}
	return 0, false
}

// Uint returns an integer value that is not negative (any U64 fits).
func (v GGUFValue) Uint() (uint64, bool) {
	switch x := v.scalar.(type) {
	case uint64:
		return x, true
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Float returns an F32 (widened exactly) or F64 value.
func (v GGUFValue) Float() (float64, bool) {
	x, ok := v.scalar.(float64)
	return x, ok
}

// Bool returns a BOOL value.
func (v GGUFValue) Bool() (bool, bool) {
	x, ok := v.scalar.(bool)
	return x, ok
}

// Text returns a STRING value (its bytes, which are UTF-8 by convention).
func (v GGUFValue) Text() (string, bool) {
	x, ok := v.scalar.(string)
	return x, ok
}

// Len is the number of elements of an array; 0 for a scalar.
func (v GGUFValue) Len() int { return len(v.items) }

// Index returns element i of an array (it panics when i is out of range, as a slice does).
func (v GGUFValue) Index(i int) GGUFValue { return v.items[i] }

// Value returns the value as plain Go: uint64, int64, float64, bool or string for a scalar, and a
// []any of those for an array.
func (v GGUFValue) Value() any {
	if v.Type != GGUFArray {
		return v.scalar
	}
	out := make([]any, len(v.items))
	for i, item := range v.items {
		out[i] = item.scalar
	}
	return out
}

// FileFormat returns the format of file `file` (0 for a one-file checkpoint).
func (c *Checkpoint) FileFormat(file int) (FileFormat, error) {
	p, err := c.use()
	if err != nil {
		return -1, err
	}
	defer c.done()
	if err := checkFileIndex(p, file); err != nil {
		return -1, err
	}
	return FileFormat(C.peft_checkpoint_file_format(p, C.size_t(file))), nil
}

// GGUFVersion returns the GGUF version (2 or 3) of file `file`; 0 for a safetensors file.
func (c *Checkpoint) GGUFVersion(file int) (uint32, error) {
	p, err := c.use()
	if err != nil {
		return 0, err
	}
	defer c.done()
	if err := checkFileIndex(p, file); err != nil {
		return 0, err
	}
	return uint32(C.peft_checkpoint_gguf_version(p, C.size_t(file))), nil
}

// GGUFMetadata returns the metadata key/values of GGUF file `file`, in file order; nil for a
// safetensors file (whose metadata Metadata returns).
func (c *Checkpoint) GGUFMetadata(file int) ([]GGUFEntry, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	if err := checkFileIndex(p, file); err != nil {
		return nil, err
	}
	f := C.size_t(file)
	if C.peft_checkpoint_file_format(p, f) != C.PEFT_FORMAT_GGUF {
		return nil, nil
	}
	entries := make([]GGUFEntry, int(C.peft_checkpoint_gguf_kv_count(p, f)))
	for i := range entries {
		kv := C.size_t(i)
		entries[i].Key = goString(C.peft_checkpoint_gguf_kv_key(p, f, kv))
		if entries[i].Value, err = ggufValue(p, f, kv); err != nil {
			return nil, err
		}
	}
	return entries, nil
}

// GGUFValue returns the metadata value of `key` in file `file` (ErrNotFound naming the key when
// the file has no such entry, also for a safetensors file).
func (c *Checkpoint) GGUFValue(file int, key string) (GGUFValue, error) {
	var cs cstrings
	defer cs.free()
	ckey, err := cs.add(key, "key")
	if err != nil {
		return GGUFValue{}, err
	}
	p, err := c.use()
	if err != nil {
		return GGUFValue{}, err
	}
	defer c.done()
	var kv C.size_t
	if err := takeError(C.peft_checkpoint_gguf_kv_find(p, C.size_t(file), ckey, &kv)); err != nil {
		return GGUFValue{}, err
	}
	return ggufValue(p, C.size_t(file), kv)
}

func checkFileIndex(p *C.peft_checkpoint, file int) error {
	if file < 0 || file >= int(C.peft_checkpoint_file_count(p)) {
		return argError("file index %d is out of range", file)
	}
	return nil
}

// ggufValue copies entry kv of file f.
func ggufValue(p *C.peft_checkpoint, f, kv C.size_t) (GGUFValue, error) {
	v := GGUFValue{Type: GGUFType(C.peft_checkpoint_gguf_kv_type(p, f, kv)), ElemType: -1}
	if v.Type != GGUFArray {
		x, err := ggufScalar(p, f, kv, 0, v.Type)
		v.scalar = x
		return v, err
	}
	v.ElemType = GGUFType(C.peft_checkpoint_gguf_kv_array_type(p, f, kv))
	n := uint64(C.peft_checkpoint_gguf_kv_array_length(p, f, kv))
	v.items = make([]GGUFValue, n)
	for i := range v.items {
		x, err := ggufScalar(p, f, kv, uint64(i), v.ElemType)
		if err != nil {
			return GGUFValue{}, err
		}
		v.items[i] = GGUFValue{Type: v.ElemType, ElemType: -1, scalar: x}
	}
	return v, nil
}

// ggufScalar reads element `element` of entry kv (0 for a scalar), stored as type t.
func ggufScalar(p *C.peft_checkpoint, f, kv C.size_t, element uint64, t GGUFType) (any, error) {
	e := C.uint64_t(element)
	switch t {
	case GGUFU8, GGUFU16, GGUFU32, GGUFU64:
		var out C.uint64_t
		err := takeError(C.peft_checkpoint_gguf_kv_uint(p, f, kv, e, &out))
		return uint64(out), err
	case GGUFI8, GGUFI16, GGUFI32, GGUFI64, GGUFBool:
		var out C.int64_t
		if err := takeError(C.peft_checkpoint_gguf_kv_int(p, f, kv, e, &out)); err != nil {
			return nil, err
		}
		if t == GGUFBool {
			return out != 0, nil
		}
		return int64(out), nil
	case GGUFF32, GGUFF64:
		var out C.double
		err := takeError(C.peft_checkpoint_gguf_kv_float(p, f, kv, e, &out))
		return float64(out), err
	case GGUFString:
		var data *C.char
		var n C.size_t
		if err := takeError(C.peft_checkpoint_gguf_kv_string(p, f, kv, e, &data, &n)); err != nil {
			return nil, err
		}
		return string(unsafe.Slice((*byte)(unsafe.Pointer(data)), int(n))), nil
	}
	key := goString(C.peft_checkpoint_gguf_kv_key(p, f, kv))
	return nil, &Error{Code: CodeUnsupported, Message: "GGUF metadata " + strconv.Quote(key) + ": values of type " + t.String() + " cannot be read"}
}
