package peft

/*
#include <stdlib.h>
#include <peft_c.h>
*/
import "C"

import (
	"strings"
	"unsafe"
)

// cstrings collects C copies of Go strings for one call and frees them together.
type cstrings struct{ list []*C.char }

// add returns a C copy of s; what names the argument in the error for a string holding a NUL byte
// (C would silently cut it there).
func (c *cstrings) add(s, what string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, argError("%s contains a NUL byte: %q", what, s)
	}
	p := C.CString(s)
	c.list = append(c.list, p)
	return p, nil
}

// addBytes returns a C copy of all of s, NUL bytes included, for the calls that take a length.
func (c *cstrings) addBytes(s string) *C.char {
	p := C.CString(s) // copies every byte of s, then a NUL
	c.list = append(c.list, p)
	return p
}

// addOptional is add, with "" passed as NULL.
func (c *cstrings) addOptional(s, what string) (*C.char, error) {
	if s == "" {
		return nil, nil
	}
	return c.add(s, what)
}

func (c *cstrings) free() {
	for _, p := range c.list {
		C.free(unsafe.Pointer(p))
	}
	c.list = nil
}

// goString copies a borrowed C string; NULL becomes "".
func goString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// takeStringList copies the strings of a list the library returned and frees the list. The result
// is never nil.
func takeStringList(list *C.peft_string_list) []string {
	defer C.peft_string_list_free(list)
	out := make([]string, int(C.peft_string_list_count(list)))
	for i := range out {
		out[i] = goString(C.peft_string_list_get(list, C.size_t(i)))
	}
	return out
}
