package peft

/*
#include <stdint.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// The library calls back into Go through these exported functions (see callbacks.c). user_data is a
// cgo.Handle, never a Go pointer. A panic must not unwind through C frames: it is recovered here,
// recorded, the operation is cancelled (nonzero status), and the Go caller re-raises it after the C
// call has returned.

//export peftcGoTensorSource
func peftcGoTensorSource(handle C.uintptr_t, offset C.uint64_t, dst unsafe.Pointer, nbytes C.uint64_t) (status C.int32_t) {
	state := cgo.Handle(handle).Value().(*sourceState)
	defer func() {
		if r := recover(); r != nil {
			state.panicked, state.panicVal = true, r
			status = 1
		}
	}()
	buf := unsafe.Slice((*byte)(dst), int(nbytes))
	if err := state.fill(uint64(offset), buf); err != nil {
		state.err = err
		return 1
	}
	return 0
}

//export peftcGoProgress
func peftcGoProgress(handle C.uintptr_t, done, total C.uint64_t) (status C.int32_t) {
	state := cgo.Handle(handle).Value().(*progressState)
	defer func() {
		if r := recover(); r != nil {
			state.panicked, state.panicVal = true, r
			status = 1
		}
	}()
	if state.report != nil {
		state.report(uint64(done), uint64(total))
	}
	if state.ctx.Err() != nil {
		return 1
	}
	return 0
}
