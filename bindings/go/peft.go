// Package peft is the Go binding of peft_c: it reads and writes safetensors files and checkpoints
// exactly as HuggingFace's reference does, loads PEFT LoRA adapters, translates tensor names, merges
// adapters into checkpoints or into host buffers, exports and combines adapters, and serves many
// adapters over one base model: a Registry of adapters loaded on first use under a byte budget,
// Leases that pin them, LoraApply for unmerged LoRA on activations, and a HostModel that swaps
// adapters into the host's own weight buffers.
//
// It calls the C library through cgo (found with pkg-config, package "peft_c") and uses nothing
// beyond the Go standard library. Built with -tags peftc_bundled, cgo compiles the library itself
// from the module's C++ sources (bindings/go/bundled-*.cpp include ../../src) and links it
// statically: then no installed peft_c is needed, only the C++ dependencies' development packages.
//
// # Errors
//
// Every failure of the library is a *Error carrying a stable Code and the library's message, which
// names the file, tensor or key at fault. Each code has a sentinel, so
//
//	if errors.Is(err, peft.ErrInvalidOffset) { ... }
//	var e *peft.Error
//	if errors.As(err, &e) { fmt.Println(e.Code, e.Message) }
//
// both work. Using a handle after Close returns an error that matches ErrClosed.
//
// # Lifetime
//
// Every handle (Checkpoint, Writer, Adapter, Translator, MergeRecord, Registry, Lease, HostModel)
// implements io.Closer. Close is idempotent and safe to call while other goroutines use the handle:
// the C object is released when the last call in progress returns, and later calls fail with
// ErrClosed. A handle that is dropped without Close is released by a runtime cleanup once the
// garbage collector finds it unreachable, but call Close (or defer it) to release file mappings,
// loaded adapters and pinned buffers promptly.
//
// The C library keeps parents alive for their children (a Translator obtained from an Adapter stays
// valid after the Adapter is closed; a Lease, and a HostModel holding an adapter, after the Registry
// is closed), so handles may be closed in any order.
//
// A HostModel keeps the addresses of the weight and bias buffers given to [HostModel.AddWeight];
// the binding pins them (runtime.Pinner) until the HostModel is closed or collected.
//
// Zero-copy views ([Checkpoint.View]) point into memory the C library owns; see View for the rule
// that keeps them valid.
//
// # Threads
//
// Checkpoint, Adapter and Translator are read-only and may be used from many goroutines at once, and
// so may a Registry and its Leases (LoraApply too, with outputs of its own). A Writer, a MergeRecord
// or a HostModel belongs to one goroutine at a time; a call made while another call on the same one
// is running fails with ErrBusy instead of racing.
package peft

/*
#cgo !peftc_bundled pkg-config: peft_c
#cgo peftc_bundled CPPFLAGS: -I${SRCDIR}/../../include -I${SRCDIR}/../../src -DPEFT_BUILD -DPEFT_STATIC -DNDEBUG
#cgo peftc_bundled CXXFLAGS: -std=c++20 -O2 -fvisibility=hidden -fvisibility-inlines-hidden
#cgo peftc_bundled LDFLAGS: -lopenblas -lpcre2-8 -lpthread -lstdc++ -lm
#include <peft_c.h>

#if PEFT_ABI_VERSION != 1
#error "this binding is written for peft_c ABI version 1"
#endif
*/
import "C"

import "fmt"

// HeaderVersion is the version of peft_c.h this binding was compiled against ("major.minor.patch").
var HeaderVersion = fmt.Sprintf("%d.%d.%d", C.PEFT_VERSION_MAJOR, C.PEFT_VERSION_MINOR, C.PEFT_VERSION_PATCH)

// HeaderABIVersion is the ABI version of peft_c.h this binding was compiled against.
const HeaderABIVersion = uint32(C.PEFT_ABI_VERSION)

// Version is the version string of the peft_c library that is running, e.g. "0.1.0".
func Version() string { return C.GoString(C.peft_version()) }

// VersionNumber is the running library's version as major*10000 + minor*100 + patch.
func VersionNumber() uint32 { return uint32(C.peft_version_number()) }

// ABIVersion is the ABI version of the peft_c library that is running.
func ABIVersion() uint32 { return uint32(C.peft_abi_version()) }

// Kernels names the kernel table the library computes with: "avx512", "avx2" or "portable", chosen
// once per process (the PEFT_C_KERNELS environment variable can lower it; see peft_kernels).
func Kernels() string { return C.GoString(C.peft_kernels()) }

// CheckVersion reports an error when the running library's ABI differs from the header's. The
// package also checks this when it is initialised and panics on a mismatch, because calling a
// library with another ABI is not memory-safe.
func CheckVersion() error {
	if got := ABIVersion(); got != HeaderABIVersion {
		return fmt.Errorf("peft: the peft_c library has ABI version %d, this binding needs %d", got, HeaderABIVersion)
	}
	return nil
}

func init() {
	if err := CheckVersion(); err != nil {
		panic(err)
	}
}
