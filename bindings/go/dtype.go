package peft

/*
#include <peft_c.h>
*/
import "C"

import (
	"math/bits"
	"strconv"
	"unsafe"
)

// DType is a safetensors element type (the PEFT_DTYPE_* values, in the reference's order).
type DType int32

// The dtypes.
const (
	Bool       DType = C.PEFT_DTYPE_BOOL
	F4         DType = C.PEFT_DTYPE_F4
	F6E2M3     DType = C.PEFT_DTYPE_F6_E2M3
	F6E3M2     DType = C.PEFT_DTYPE_F6_E3M2
	U8         DType = C.PEFT_DTYPE_U8
	I8         DType = C.PEFT_DTYPE_I8
	F8E5M2     DType = C.PEFT_DTYPE_F8_E5M2
	F8E4M3     DType = C.PEFT_DTYPE_F8_E4M3
	F8E8M0     DType = C.PEFT_DTYPE_F8_E8M0
	F8E4M3FNUZ DType = C.PEFT_DTYPE_F8_E4M3FNUZ
	F8E5M2FNUZ DType = C.PEFT_DTYPE_F8_E5M2FNUZ
	I16        DType = C.PEFT_DTYPE_I16
	U16        DType = C.PEFT_DTYPE_U16
	F16        DType = C.PEFT_DTYPE_F16
	BF16       DType = C.PEFT_DTYPE_BF16
	I32        DType = C.PEFT_DTYPE_I32
	U32        DType = C.PEFT_DTYPE_U32
	F32        DType = C.PEFT_DTYPE_F32
	C64        DType = C.PEFT_DTYPE_C64
	F64        DType = C.PEFT_DTYPE_F64
	I64        DType = C.PEFT_DTYPE_I64
	U64        DType = C.PEFT_DTYPE_U64
	DTypeCount       = int(C.PEFT_DTYPE_COUNT) // number of dtypes; valid values are 0 .. DTypeCount-1
)

// String is the safetensors name, e.g. "BF16"; "DType(N)" for a value that is not a dtype.
func (d DType) String() string {
	if p := C.peft_dtype_name(C.int32_t(d)); p != nil {
		return C.GoString(p)
	}
	return "DType(" + strconv.Itoa(int(d)) + ")"
}

// Valid reports whether d is one of the dtypes.
func (d DType) Valid() bool { return d >= 0 && int(d) < DTypeCount }

// Bits is the size of one element in bits (4 for F4, 6 for the F6 types); 0 for an invalid dtype.
func (d DType) Bits() int { return int(C.peft_dtype_bits(C.int32_t(d))) }

// ParseDType returns the dtype of a safetensors name (exact and case-sensitive, as the reference
// reads it), or an ErrInvalidArgument error.
func ParseDType(name string) (DType, error) {
	var cs cstrings
	defer cs.free()
	p, err := cs.add(name, "dtype name")
	if err != nil {
		return -1, err
	}
	d := C.peft_dtype_from_name(p)
	if d < 0 {
		return -1, argError("%q is not a safetensors dtype", name)
	}
	return DType(d), nil
}

// byteSize is the number of bytes of n elements of d, or an error when they are not whole bytes
// or the size overflows.
func (d DType) byteSize(n uint64) (uint64, error) {
	if !d.Valid() {
		return 0, argError("unknown dtype %d", int32(d))
	}
	hi, lo := bits.Mul64(n, uint64(d.Bits()))
	if hi != 0 {
		return 0, &Error{Code: CodeValidationOverflow, Message: "the size of " + strconv.FormatUint(n, 10) + " " + d.String() + " elements overflows"}
	}
	if lo%8 != 0 {
		return 0, &Error{Code: CodeMisalignedSlice, Message: strconv.FormatUint(n, 10) + " " + d.String() + " elements do not fill whole bytes"}
	}
	return lo / 8, nil
}

// elementCount is the product of a shape, or an overflow error.
func elementCount(shape []uint64) (uint64, error) {
	n := uint64(1)
	for _, dim := range shape {
		hi, lo := bits.Mul64(n, dim)
		if hi != 0 {
			return 0, &Error{Code: CodeValidationOverflow, Message: "the element count of the shape overflows"}
		}
		n = lo
	}
	return n, nil
}

// Convert converts the elements of src (dtype srcType) into dst (dtype dstType), like copy. The
// number of elements is the number src holds; dst must have room for exactly that many.
//
// Supported: F64, F32, F16, BF16, F8E4M3, F8E5M2, Bool and the integer types into F64, F32, F16 or
// BF16, and any dtype into itself. Floats round to nearest, ties to even. Other pairs are
// ErrUnsupported. Safe for concurrent use.
func Convert(dst []byte, dstType DType, src []byte, srcType DType) error {
	if !srcType.Valid() || !dstType.Valid() {
		return argError("unknown dtype in a conversion from %d to %d", int32(srcType), int32(dstType))
	}
	srcBits := uint64(srcType.Bits())
	total := uint64(len(src)) * 8
	if total%srcBits != 0 {
		return argError("%d bytes are not whole %s elements", len(src), srcType)
	}
	count := total / srcBits
	need, err := dstType.byteSize(count)
	if err != nil {
		return err
	}
	if uint64(len(dst)) != need {
		return argError("the destination has %d bytes; %d %s elements need %d", len(dst), count, dstType, need)
	}
	if count == 0 {
		return nil
	}
	return takeError(C.peft_convert(C.int32_t(srcType), unsafe.Pointer(&src[0]), C.int32_t(dstType),
		unsafe.Pointer(&dst[0]), C.uint64_t(count)))
}
