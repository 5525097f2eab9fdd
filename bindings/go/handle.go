package peft

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// closedBit marks a closed handle in handle.state; the bits below it count the calls in progress.
const closedBit = int64(1) << 62

// handle owns one C object and decides when it is released: at Close once no call is using it, or
// by a runtime cleanup when its Go owner becomes unreachable without Close. Calls bracket their use
// of the C pointer with acquire/release, so Close never frees an object a running call uses.
type handle struct {
	ptr     unsafe.Pointer
	state   atomic.Int64
	free    func(unsafe.Pointer)
	cleanup runtime.Cleanup
	what    string
	busy    sync.Mutex // held by the call in progress on a one-goroutine handle (Writer, MergeRecord)
}

// cleanupArg is what the runtime cleanup needs; it must not reach the owner, or the owner would
// never become unreachable.
type cleanupArg struct {
	ptr  unsafe.Pointer
	free func(unsafe.Pointer)
}

// debugCalls counts calls when built with the "debug" tag, which collects garbage every
// debugGCStride-th call (every call would make the test suite take minutes).
var debugCalls atomic.Int64

const debugGCStride = 4

// liveHandles counts C objects the binding owns and has not released yet (tests check it).
var liveHandles atomic.Int64

// track makes h own ptr on behalf of owner (the Go object embedding h).
func track[T any](owner *T, h *handle, ptr unsafe.Pointer, what string, free func(unsafe.Pointer)) {
	h.ptr, h.what, h.free = ptr, what, free
	liveHandles.Add(1)
	h.cleanup = runtime.AddCleanup(owner, releaseUnreachable, cleanupArg{ptr, free})
}

// releaseUnreachable is the cleanup of an owner collected without Close: no call can be running.
func releaseUnreachable(a cleanupArg) {
	a.free(a.ptr)
	liveHandles.Add(-1)
}

// acquire returns the C pointer for one call, or ErrClosed. Every successful acquire is paired with
// one release after the last C call that uses the pointer.
func (h *handle) acquire() (unsafe.Pointer, error) {
	for {
		s := h.state.Load()
		if s&closedBit != 0 {
			return nil, closedError{h.what}
		}
		if h.state.CompareAndSwap(s, s+1) {
			if debugGC && debugCalls.Add(1)%debugGCStride == 0 {
				runtime.GC() // with -tags debug: collect while the call holds only the pointer
			}
			return h.ptr, nil
		}
	}
}

// acquireExclusive is acquire for handles that belong to one goroutine at a time: a second call
// while one is running gets ErrBusy instead of racing inside the library.
func (h *handle) acquireExclusive() (unsafe.Pointer, error) {
	if !h.busy.TryLock() {
		if h.state.Load()&closedBit != 0 {
			return nil, closedError{h.what}
		}
		return nil, busyError{h.what}
	}
	p, err := h.acquire()
	if err != nil {
		h.busy.Unlock()
	}
	return p, err
}

// release ends one call; the last call after Close releases the C object.
func (h *handle) release() {
	if h.state.Add(-1) == closedBit {
		h.destroy()
	}
}

func (h *handle) releaseExclusive() {
	h.release()
	h.busy.Unlock()
}

// close marks the handle closed (idempotent) and releases the C object now, or when the calls in
// progress return.
func (h *handle) close() {
	for {
		s := h.state.Load()
		if s&closedBit != 0 {
			return
		}
		if h.state.CompareAndSwap(s, s|closedBit) {
			h.cleanup.Stop()
			if s == 0 {
				h.destroy()
			}
			return
		}
	}
}

// closed reports whether close was called.
func (h *handle) closed() bool { return h.state.Load()&closedBit != 0 }

func (h *handle) destroy() {
	h.free(h.ptr)
	liveHandles.Add(-1)
}
