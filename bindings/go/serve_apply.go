// Serving, unmerged LoRA on activations (src/capi/serve_apply_api.cpp): LoraApply.

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
// ErrNotFound for a DoRA layer whose base weight was not given with Registry.SetBaseWeight (for
// DoRA, y is the base output with its bias); ErrUnsupported for an embedding or Conv2d layer or
// another dtype; ErrInvalidArgument for an index out of range or buffers that do not match their
// shapes. Calls writing different outputs
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
