package peft

/*
#include <peft_c.h>
*/
import "C"

import (
	"errors"
	"fmt"
)

// Code is a stable error code of peft_c (the PEFT_ERR_* constants); values are never renumbered.
type Code int32

// The codes. The first ten are the failure kinds of the reference safetensors reader.
const (
	CodeOK                       Code = C.PEFT_OK
	CodeHeaderTooSmall           Code = C.PEFT_ERR_HEADER_TOO_SMALL
	CodeHeaderTooLarge           Code = C.PEFT_ERR_HEADER_TOO_LARGE
	CodeInvalidHeaderLength      Code = C.PEFT_ERR_INVALID_HEADER_LENGTH
	CodeInvalidHeaderUTF8        Code = C.PEFT_ERR_INVALID_HEADER_UTF8
	CodeInvalidHeader            Code = C.PEFT_ERR_INVALID_HEADER
	CodeInvalidOffset            Code = C.PEFT_ERR_INVALID_OFFSET
	CodeValidationOverflow       Code = C.PEFT_ERR_VALIDATION_OVERFLOW
	CodeMisalignedSlice          Code = C.PEFT_ERR_MISALIGNED_SLICE
	CodeTensorInvalidInfo        Code = C.PEFT_ERR_TENSOR_INVALID_INFO
	CodeMetadataIncompleteBuffer Code = C.PEFT_ERR_METADATA_INCOMPLETE_BUFFER
	CodeIO                       Code = C.PEFT_ERR_IO
	CodeNotFound                 Code = C.PEFT_ERR_NOT_FOUND
	CodeUnsupported              Code = C.PEFT_ERR_UNSUPPORTED
	CodeUnresolvedKey            Code = C.PEFT_ERR_UNRESOLVED_KEY
	CodeShapeMismatch            Code = C.PEFT_ERR_SHAPE_MISMATCH
	CodeInvalidArgument          Code = C.PEFT_ERR_INVALID_ARGUMENT
	CodeOutOfMemory              Code = C.PEFT_ERR_OUT_OF_MEMORY
	CodeCancelled                Code = C.PEFT_ERR_CANCELLED
	CodeInvalidConfig            Code = C.PEFT_ERR_INVALID_CONFIG
	CodeInvalidCheckpoint        Code = C.PEFT_ERR_INVALID_CHECKPOINT
	CodeOverBudget               Code = C.PEFT_ERR_OVER_BUDGET
	CodeNonFinite                Code = C.PEFT_ERR_NON_FINITE
	CodeInternal                 Code = C.PEFT_ERR_INTERNAL
)

// String is the code's name as the library spells it, e.g. "INVALID_OFFSET" ("UNKNOWN" for a value
// that is not a code).
func (c Code) String() string { return C.GoString(C.peft_error_code_name(C.int32_t(c))) }

// IsFormat reports whether the code is one of the safetensors format errors (a file the reference
// reader rejects), CodeHeaderTooSmall through CodeMetadataIncompleteBuffer.
func (c Code) IsFormat() bool { return c >= CodeHeaderTooSmall && c <= CodeMetadataIncompleteBuffer }

// Error is an error reported by peft_c: a stable code and the library's message.
//
// The sentinels below are *Error values with an empty message; errors.Is(err, sentinel) compares
// codes only, so errors.Is(err, ErrInvalidOffset) holds for every INVALID_OFFSET error.
type Error struct {
	Code    Code   // the stable code
	Message string // UTF-8, naming the file, tensor or key at fault
	cause   error  // what made the binding report it (context.Canceled for a cancelled merge), or nil
}

// Error formats the error as "peft: CODE_NAME: message".
func (e *Error) Error() string {
	if e.Message == "" {
		return "peft: " + e.Code.String()
	}
	return "peft: " + e.Code.String() + ": " + e.Message
}

// Is reports whether target is a *Error with the same code and either an empty message (a sentinel)
// or the same message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Unwrap returns the cause the binding attached, e.g. the context's error for a merge cancelled
// through its context, so errors.Is(err, context.Canceled) holds too.
func (e *Error) Unwrap() error { return e.cause }

// Sentinels, one per code, for errors.Is.
var (
	ErrHeaderTooSmall           = &Error{Code: CodeHeaderTooSmall}
	ErrHeaderTooLarge           = &Error{Code: CodeHeaderTooLarge}
	ErrInvalidHeaderLength      = &Error{Code: CodeInvalidHeaderLength}
	ErrInvalidHeaderUTF8        = &Error{Code: CodeInvalidHeaderUTF8}
	ErrInvalidHeader            = &Error{Code: CodeInvalidHeader}
	ErrInvalidOffset            = &Error{Code: CodeInvalidOffset}
	ErrValidationOverflow       = &Error{Code: CodeValidationOverflow}
	ErrMisalignedSlice          = &Error{Code: CodeMisalignedSlice}
	ErrTensorInvalidInfo        = &Error{Code: CodeTensorInvalidInfo}
	ErrMetadataIncompleteBuffer = &Error{Code: CodeMetadataIncompleteBuffer}
	ErrIO                       = &Error{Code: CodeIO}
	ErrNotFound                 = &Error{Code: CodeNotFound}
	ErrUnsupported              = &Error{Code: CodeUnsupported}
	ErrUnresolvedKey            = &Error{Code: CodeUnresolvedKey}
	ErrShapeMismatch            = &Error{Code: CodeShapeMismatch}
	ErrInvalidArgument          = &Error{Code: CodeInvalidArgument}
	ErrOutOfMemory              = &Error{Code: CodeOutOfMemory}
	ErrCancelled                = &Error{Code: CodeCancelled}
	ErrInvalidConfig            = &Error{Code: CodeInvalidConfig}
	ErrInvalidCheckpoint        = &Error{Code: CodeInvalidCheckpoint}
	ErrOverBudget               = &Error{Code: CodeOverBudget}
	ErrNonFinite                = &Error{Code: CodeNonFinite}
	ErrInternal                 = &Error{Code: CodeInternal}
)

// Errors of the binding itself (not codes of the library).
var (
	// ErrClosed is matched by the error of a call on a handle after Close.
	ErrClosed = errors.New("peft: use of a closed handle")
	// ErrBusy is matched by the error of a call on a Writer, MergeRecord, ControlRecord or HostModel while another
	// call on it is running (they belong to one goroutine at a time).
	ErrBusy = errors.New("peft: handle is in use by another call")
)

// sentinels maps each code to its sentinel (for tests and for ErrorForCode).
var sentinels = map[Code]*Error{
	CodeHeaderTooSmall: ErrHeaderTooSmall, CodeHeaderTooLarge: ErrHeaderTooLarge,
	CodeInvalidHeaderLength: ErrInvalidHeaderLength, CodeInvalidHeaderUTF8: ErrInvalidHeaderUTF8,
	CodeInvalidHeader: ErrInvalidHeader, CodeInvalidOffset: ErrInvalidOffset,
	CodeValidationOverflow: ErrValidationOverflow, CodeMisalignedSlice: ErrMisalignedSlice,
	CodeTensorInvalidInfo: ErrTensorInvalidInfo, CodeMetadataIncompleteBuffer: ErrMetadataIncompleteBuffer,
	CodeIO: ErrIO, CodeNotFound: ErrNotFound, CodeUnsupported: ErrUnsupported,
	CodeUnresolvedKey: ErrUnresolvedKey, CodeShapeMismatch: ErrShapeMismatch,
	CodeInvalidArgument: ErrInvalidArgument, CodeOutOfMemory: ErrOutOfMemory, CodeCancelled: ErrCancelled,
	CodeInvalidConfig: ErrInvalidConfig, CodeInvalidCheckpoint: ErrInvalidCheckpoint, CodeOverBudget: ErrOverBudget,
	CodeNonFinite: ErrNonFinite, CodeInternal: ErrInternal,
}

// Sentinel returns the sentinel of a code, or nil for CodeOK and values that are not codes.
func Sentinel(code Code) *Error { return sentinels[code] }

// takeError converts a C error into a Go error and releases the C error. nil stays nil.
func takeError(err *C.peft_error) error {
	if err == nil {
		return nil
	}
	defer C.peft_error_free(err)
	return &Error{Code: Code(C.peft_error_code(err)), Message: C.GoString(C.peft_error_message(err))}
}

// closedError is the error of a call on a closed handle; it matches ErrClosed.
type closedError struct{ what string }

func (e closedError) Error() string   { return "peft: use of a closed " + e.what }
func (e closedError) Is(t error) bool { return t == ErrClosed }

// busyError is the error of a call on a one-goroutine handle that is in use; it matches ErrBusy.
type busyError struct{ what string }

func (e busyError) Error() string   { return "peft: " + e.what + " is in use by another call" }
func (e busyError) Is(t error) bool { return t == ErrBusy }

// argError is an INVALID_ARGUMENT error found by the binding before calling the library (for
// arguments the C API cannot check, such as the length of a Go slice).
func argError(format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(format, args...)}
}
