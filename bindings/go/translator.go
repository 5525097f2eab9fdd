package peft

/*
#include <stdlib.h>
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Translator maps tensor keys between HuggingFace names
// ("base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight") and a host's slash-separated
// native names ("transformer/layer_4/attention/query/lora_a") with an architecture table. It is
// read-only: every method may be called from many goroutines at once.
type Translator struct {
	h handle
}

func newTranslator(p *C.peft_translator) *Translator {
	t := &Translator{}
	track(t, &t.h, unsafe.Pointer(p), "Translator", freeTranslator)
	return t
}

func freeTranslator(p unsafe.Pointer) { C.peft_translator_free((*C.peft_translator)(p)) }

// NewBuiltinTranslator returns a translator over a built-in architecture table ("llama", "gpt2",
// ...; see BuiltinFamilies). ErrNotFound when no such table is installed.
func NewBuiltinTranslator(family string) (*Translator, error) {
	return makeTranslator(family, "family", func(s *C.char, out **C.peft_translator) *C.peft_error {
		return C.peft_translator_new_builtin(s, out)
	})
}

// TranslatorFromFile returns a translator over the caller's table in a JSON file (format:
// docs/translation-tables.md). ErrIO or ErrInvalidConfig naming the rule at fault.
func TranslatorFromFile(path string) (*Translator, error) {
	return makeTranslator(path, "path", func(s *C.char, out **C.peft_translator) *C.peft_error {
		return C.peft_translator_from_file(s, out)
	})
}

// TranslatorFromJSON returns a translator over the caller's table given as JSON.
func TranslatorFromJSON(table string) (*Translator, error) {
	return makeTranslator(table, "table", func(s *C.char, out **C.peft_translator) *C.peft_error {
		return C.peft_translator_from_json(s, out)
	})
}

func makeTranslator(arg, what string, create func(*C.char, **C.peft_translator) *C.peft_error) (*Translator, error) {
	var cs cstrings
	defer cs.free()
	carg, err := cs.add(arg, what)
	if err != nil {
		return nil, err
	}
	var out *C.peft_translator
	if err := takeError(create(carg, &out)); err != nil {
		return nil, err
	}
	return newTranslator(out), nil
}

// TranslatorFromGGUF returns a translator for GGUF names from a checkpoint opened on one GGUF model
// file: its general.architecture chooses the table and its attention head counts the RoPE row
// order. ToNative turns "model.layers.0.self_attn.q_proj.weight" into "blk.0.attn_q.weight" (the
// roles weight and bias only) and ToHF back; given to WithNativeNames (buffer merges) or HostModel.SetTranslator,
// layer names are GGUF tensor names of buffers laid out as a llama.cpp-family engine loads them
// (include/peft_c.h, peft_translator_from_gguf). The translator copies what it needs; the checkpoint
// may be closed afterwards. A file without head counts gives a translator whose reordered weights
// fail with ErrShapeMismatch when merged or added to a host model.
//
// Errors: ErrInvalidArgument for a checkpoint that is not one GGUF file; ErrInvalidCheckpoint
// without a string general.architecture; ErrUnsupported when no built-in table reads the
// architecture; ErrNotFound or ErrInvalidConfig when the tables cannot be read.
func TranslatorFromGGUF(c *Checkpoint) (*Translator, error) {
	p, err := c.use()
	if err != nil {
		return nil, err
	}
	defer c.done()
	var out *C.peft_translator
	if err := takeError(C.peft_translator_from_gguf(p, &out)); err != nil {
		return nil, err
	}
	return newTranslator(out), nil
}

// NewGGUFTranslator returns a translator for GGUF names from a GGUF architecture ("llama", "qwen2",
// "gemma2", ...) and its head counts, for hosts that hold the weights without the file (see
// TranslatorFromGGUF). headCount is at least 1; headCountKV 0 means headCount.
//
// Errors: ErrInvalidArgument for a headCount of 0; ErrUnsupported when no built-in table reads the
// architecture; ErrNotFound or ErrInvalidConfig when the tables cannot be read.
func NewGGUFTranslator(architecture string, headCount, headCountKV uint64) (*Translator, error) {
	return makeTranslator(architecture, "architecture", func(s *C.char, out **C.peft_translator) *C.peft_error {
		return C.peft_translator_new_gguf(s, C.uint64_t(headCount), C.uint64_t(headCountKV), out)
	})
}

// DetectTranslator detects the architecture family of a base model folder (its config.json) or,
// failing that, of a model name such as "meta-llama/Llama-3.2-1B", and returns its built-in
// translator. Either argument may be "". ErrNotFound when no family matches.
func DetectTranslator(baseDir, modelName string) (*Translator, error) {
	var cs cstrings
	defer cs.free()
	cbase, err := cs.addOptional(baseDir, "base folder")
	if err != nil {
		return nil, err
	}
	cname, err := cs.addOptional(modelName, "model name")
	if err != nil {
		return nil, err
	}
	var out *C.peft_translator
	if err := takeError(C.peft_translator_detect(cbase, cname, &out)); err != nil {
		return nil, err
	}
	return newTranslator(out), nil
}

// BuiltinFamilies lists the built-in architecture families, sorted.
func BuiltinFamilies() ([]string, error) {
	var out *C.peft_string_list
	if err := takeError(C.peft_translator_builtin_family_list(&out)); err != nil {
		return nil, err
	}
	return takeStringList(out), nil
}

// Close releases the translator. Idempotent; returns nil.
func (t *Translator) Close() error {
	if t == nil {
		return nil
	}
	t.h.close()
	return nil
}

func (t *Translator) use() (*C.peft_translator, error) {
	p, err := t.h.acquire()
	return (*C.peft_translator)(p), err
}

func (t *Translator) done() {
	t.h.release()
	runtime.KeepAlive(t)
}

// Family is the table's family name ("" after Close).
func (t *Translator) Family() string {
	p, err := t.use()
	if err != nil {
		return ""
	}
	defer t.done()
	return goString(C.peft_translator_family(p))
}

// takeString converts a string the library returned through char** and releases it.
func takeString(s *C.char) string {
	defer C.peft_string_free(s)
	return C.GoString(s)
}

// ToNative translates one HuggingFace key (with or without "base_model.model.") to its native
// name; ErrUnresolvedKey naming the key when the table does not resolve it.
func (t *Translator) ToNative(hfKey string) (string, error) {
	var cs cstrings
	defer cs.free()
	ckey, err := cs.add(hfKey, "key")
	if err != nil {
		return "", err
	}
	p, err := t.use()
	if err != nil {
		return "", err
	}
	defer t.done()
	var out *C.char
	if err := takeError(C.peft_translator_to_native(p, ckey, &out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}

// ToHF translates one native name back to its HuggingFace key, with "base_model.model." prepended
// when withPEFTPrefix is set (as keys in adapter files have).
func (t *Translator) ToHF(nativeKey string, withPEFTPrefix bool) (string, error) {
	var cs cstrings
	defer cs.free()
	ckey, err := cs.add(nativeKey, "native key")
	if err != nil {
		return "", err
	}
	p, err := t.use()
	if err != nil {
		return "", err
	}
	defer t.done()
	var out *C.char
	if err := takeError(C.peft_translator_to_hf(p, ckey, boolInt(withPEFTPrefix), &out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}

// ToNativeAll translates many HuggingFace keys at once; it fails listing every key that does not
// resolve.
func (t *Translator) ToNativeAll(hfKeys []string) ([]string, error) {
	return t.batch(hfKeys, func(p *C.peft_translator, keys **C.char, n C.size_t, out **C.char) *C.peft_error {
		return C.peft_translator_to_native_batch(p, keys, n, out)
	})
}

// ToHFAll translates many native names back at once; it fails listing every name that does not
// resolve.
func (t *Translator) ToHFAll(nativeKeys []string, withPEFTPrefix bool) ([]string, error) {
	return t.batch(nativeKeys, func(p *C.peft_translator, keys **C.char, n C.size_t, out **C.char) *C.peft_error {
		return C.peft_translator_to_hf_batch(p, keys, n, boolInt(withPEFTPrefix), out)
	})
}

// batch runs a batch translation with the key array and the result array in C memory.
func (t *Translator) batch(keys []string, run func(*C.peft_translator, **C.char, C.size_t, **C.char) *C.peft_error) ([]string, error) {
	if len(keys) == 0 {
		return []string{}, nil
	}
	var cs cstrings
	defer cs.free()
	ptrSize := C.size_t(unsafe.Sizeof((*C.char)(nil)))
	in := (**C.char)(C.calloc(C.size_t(len(keys)), ptrSize))
	out := (**C.char)(C.calloc(C.size_t(len(keys)), ptrSize))
	defer C.free(unsafe.Pointer(in))
	defer C.free(unsafe.Pointer(out))
	inSlice, outSlice := unsafe.Slice(in, len(keys)), unsafe.Slice(out, len(keys))
	for i, k := range keys {
		var err error
		if inSlice[i], err = cs.add(k, "key"); err != nil {
			return nil, err
		}
	}
	p, err := t.use()
	if err != nil {
		return nil, err
	}
	defer t.done()
	if err := takeError(run(p, in, C.size_t(len(keys)), out)); err != nil {
		return nil, err
	}
	result := make([]string, len(keys))
	for i, s := range outSlice {
		result[i] = takeString(s)
	}
	return result, nil
}
