package peft_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// Fixture files that the reference writer wrote (the others have hand-made headers).
func referenceWritten(t *testing.T) []string {
	handMade := map[string]bool{"padded_header": true, "pretty_header": true, "unordered_header": true,
		"escapes_in_header": true, "unknown_fields": true, "metadata_null": true, "metadata_empty": true,
		"metadata_dup_inner": true, "big_numbers": true}
	var out []string
	for _, path := range fileCases(t) {
		if !handMade[strings.TrimSuffix(filepath.Base(path), ".safetensors")] {
			out = append(out, path)
		}
	}
	return out
}

// rewrite declares every tensor of c and writes it, choosing a different way of streaming for each
// tensor (from the checkpoint, a buffer, chunks, a callback, an io.Reader).
func rewrite(t *testing.T, c *peft.Checkpoint, w *peft.Writer) {
	t.Helper()
	infos, err := c.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]peft.TensorInfo{}
	for _, info := range infos {
		if err := w.AddTensor(info.Name, info.DType, info.Shape...); err != nil {
			t.Fatal(err)
		}
		byName[info.Name] = info
	}
	order, err := w.Order()
	if err != nil {
		t.Fatal(err)
	}
	if len(order.Names) != len(infos) || w.TensorCount() != len(infos) {
		t.Fatalf("order %v for %d tensors", order.Names, len(infos))
	}
	for pos, name := range order.Names {
		info := byName[name]
		if infos[order.Declarations[pos]].Name != name {
			t.Fatalf("declaration index of %q is wrong", name)
		}
		view, err := c.View(info.Index)
		if err != nil {
			t.Fatal(err)
		}
		gcPoint()
		switch pos % 5 {
		case 0:
			err = w.WriteFromCheckpoint(name, c, info.Index)
		case 1:
			err = w.WriteTensor(name, info.DType, view)
		case 2:
			if err = w.BeginTensor(name, info.DType); err == nil {
				for rest := view; len(rest) > 0 && err == nil; {
					n := min(len(rest), 3)
					_, err = w.Write(rest[:n])
					rest = rest[n:]
				}
			}
		case 3:
			next := uint64(0)
			err = w.WriteFrom(name, info.DType, func(offset uint64, dst []byte) error {
				if offset != next {
					t.Errorf("chunk at %d, want %d", offset, next)
				}
				next += uint64(copy(dst, view[offset:]))
				return nil
			})
		case 4:
			err = w.WriteFromReader(name, info.DType, bytes.NewReader(view))
		}
		if err != nil {
			t.Fatalf("writing %q (way %d): %v", name, pos%5, err)
		}
	}
}

// The writer reproduces every reference-written fixture byte for byte.
func TestWriterReproducesReference(t *testing.T) {
	dir := t.TempDir()
	for _, path := range referenceWritten(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			c := mustOpen(t, path) // escaped_names has names holding NUL bytes
			out := filepath.Join(dir, filepath.Base(path))
			w, err := peft.NewWriter(out)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			meta, _ := c.Metadata(0)
			if meta != nil {
				if err := w.SetMetadataPresent(true); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range meta {
				if err := w.SetMetadata(k, v); err != nil {
					t.Fatal(err)
				}
			}
			rewrite(t, c, w)
			if err := w.Finish(); err != nil {
				t.Fatal(err)
			}
			sameFile(t, out, path)
		})
	}
}

func sameFile(t *testing.T, got, want string) {
	t.Helper()
	g, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		n := 0
		for n < len(g) && n < len(w) && g[n] == w[n] {
			n++
		}
		t.Fatalf("%s differs from %s at byte %d (%d vs %d bytes)", got, want, n, len(g), len(w))
	}
}

// A checkpoint writer with the fixture's shard breaks reproduces transformers' sharded folder.
func TestCheckpointWriterReproducesShards(t *testing.T) {
	src := fixture("safetensors", "sharded")
	c := mustOpen(t, src)
	out := filepath.Join(t.TempDir(), "out")
	w, err := peft.NewCheckpointWriter(out, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	infos, _ := c.Tensors()
	for i, info := range infos {
		if i > 0 && info.File != infos[i-1].File {
			if err := w.BreakShard(); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.AddTensor(info.Name, info.DType, info.Shape...); err != nil {
			t.Fatal(err)
		}
	}
	if meta, ok, _ := c.IndexMetadataJSON(); ok {
		if err := w.SetIndexMetadataJSON(meta); err != nil {
			t.Fatal(err)
		}
	}
	order, err := w.Order()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := c.Files()
	if len(order.Files) != len(files) {
		t.Fatalf("%d shards, want %d", len(order.Files), len(files))
	}
	for _, name := range order.Names {
		i, err := c.Find(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteFromCheckpoint(name, c, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		sameFile(t, filepath.Join(out, filepath.Base(f)), f)
	}
	sameFile(t, filepath.Join(out, "model.safetensors.index.json"), filepath.Join(src, "model.safetensors.index.json"))
}

func TestWriterConvertsWhileWriting(t *testing.T) {
	src := []float32{1, -2.5, 3.14159, 65519, 1e-8, 0}
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	raw := float32Raw(src)
	if err := peft.SaveFile(path, []peft.TensorData{{Name: "w", DType: peft.F32, Shape: []uint64{2, 3}, Data: raw}},
		map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	w, err := peft.NewWriter(filepath.Join(dir, "bf16.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.AddTensor("w", peft.BF16, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("w", peft.F32, raw); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, filepath.Join(dir, "bf16.safetensors"))
	view, _ := c.View(0)
	want := make([]byte, 12)
	if err := peft.Convert(want, peft.BF16, raw, peft.F32); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(view, want) {
		t.Fatalf("converted bytes %x, want %x", view, want)
	}
	if meta, _ := c.Metadata(0); meta != nil {
		t.Fatalf("metadata %v on a file written without", meta)
	}
	c2 := mustOpen(t, path)
	if meta, _ := c2.Metadata(0); meta["format"] != "pt" {
		t.Fatalf("SaveFile metadata %v", meta)
	}
}

func float32Raw(f []float32) []byte {
	var b bytes.Buffer
	for _, v := range f {
		u := math.Float32bits(v)
		b.Write([]byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)})
	}
	return b.Bytes()
}

func TestWriterErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "e.safetensors")
	w, err := peft.NewWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wantCode(t, w.AddTensor("__metadata__", peft.F32, 1), peft.CodeInvalidArgument)
	wantCode(t, w.AddTensor("odd", peft.F4, 3), peft.CodeMisalignedSlice)
	wantCode(t, w.AddTensor("huge", peft.F64, 1<<62, 1<<3), peft.CodeValidationOverflow)
	wantCode(t, w.AddTensor("bad", peft.DType(77), 1), peft.CodeInvalidArgument)
	wantCode(t, w.BreakShard(), peft.CodeInvalidArgument) // not a checkpoint writer
	for _, name := range []string{"a", "b"} {
		if err := w.AddTensor(name, peft.F32, 2); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, w.AddTensor("a", peft.F32, 2), peft.CodeInvalidArgument) // duplicate
	if err := w.SetMetadata("k", "v"); err != nil {
		t.Fatal(err)
	}
	eight := make([]byte, 8)
	wantCode(t, w.WriteTensor("b", peft.F32, eight), peft.CodeInvalidArgument) // not the next one
	wantCode(t, w.WriteTensor("a", peft.F32, eight[:4]), peft.CodeTensorInvalidInfo)
	wantCode(t, w.AddTensor("c", peft.F32, 2), peft.CodeInvalidArgument) // started
	wantCode(t, w.SetMetadata("k2", "v"), peft.CodeInvalidArgument)
	if _, err := w.Write(eight); err == nil { // no begun tensor
		t.Fatal("Write without BeginTensor succeeded")
	}
	if err := w.WriteTensor("a", peft.F32, eight); err != nil { // argument errors changed nothing
		t.Fatal(err)
	}
	wantCode(t, w.Finish(), peft.CodeInvalidArgument) // b is missing
	if err := w.BeginTensor("b", peft.F32); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 12)); err == nil {
		t.Fatal("wrote more bytes than the tensor has")
	}
	if n, err := io.Copy(w, bytes.NewReader(eight)); err != nil || n != 8 {
		t.Fatalf("io.Copy: %d %v", n, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("the file exists before Finish")
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, path)
	if meta, _ := c.Metadata(0); meta["k"] != "v" || c.TensorCount() != 2 {
		t.Fatalf("written file: %v, %d tensors", meta, c.TensorCount())
	}
	_, err = peft.NewWriter("")
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.NewCheckpointWriter("", 0)
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.NewWriter("x\x00")
	wantCode(t, err, peft.CodeInvalidArgument)
}

// A source callback that fails cancels the write: the error unwraps to the callback's, the output is
// discarded, and the writer refuses further writes.
func TestWriterCallbackErrorCancels(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.safetensors")
	if err := os.WriteFile(path, []byte("old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := peft.NewWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.AddTensor("big", peft.F32, 3<<20); err != nil { // 12 MiB: several chunks
		t.Fatal(err)
	}
	stop := errors.New("source ran dry")
	calls := 0
	err = w.WriteFrom("big", peft.F32, func(offset uint64, dst []byte) error {
		if calls++; calls == 2 {
			return stop
		}
		return nil
	})
	wantCode(t, err, peft.CodeCancelled)
	if !errors.Is(err, stop) {
		t.Fatalf("%v does not unwrap to the callback's error", err)
	}
	wantCode(t, w.WriteTensor("big", peft.F32, make([]byte, 12<<20)), peft.CodeInvalidArgument)
	w.Close()
	if data, _ := os.ReadFile(path); string(data) != "old content" {
		t.Fatal("the target changed after a cancelled write")
	}
	noTemporaries(t, dir)
	// A short io.Reader cancels too.
	w2, _ := peft.NewWriter(filepath.Join(dir, "r.safetensors"))
	defer w2.Close()
	w2.AddTensor("x", peft.F32, 4)
	err = w2.WriteFromReader("x", peft.F32, strings.NewReader("short"))
	if !errors.Is(err, peft.ErrCancelled) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short reader: %v", err)
	}
}

func noTemporaries(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "peft-tmp") {
			t.Fatalf("temporary %s left behind", e.Name())
		}
	}
}

// A panic in a source callback does not unwind through C: the write is cancelled and the panic is
// raised again in the caller, with the writer still usable for Close.
func TestWriterCallbackPanic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.safetensors")
	w, err := peft.NewWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.AddTensor("x", peft.F32, 4)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want boom", r)
			}
		}()
		w.WriteFrom("x", peft.F32, func(uint64, []byte) error { panic("boom") })
		t.Fatal("the panic was swallowed")
	}()
	wantCode(t, w.Finish(), peft.CodeInvalidArgument)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("a file was written")
	}
	noTemporaries(t, dir)
}

// A Writer belongs to one goroutine at a time: a call from inside its own callback gets ErrBusy.
func TestWriterBusy(t *testing.T) {
	w, err := peft.NewWriter(filepath.Join(t.TempDir(), "b.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.AddTensor("x", peft.F32, 4)
	var inner error
	err = w.WriteFrom("x", peft.F32, func(uint64, []byte) error {
		_, inner = w.Write([]byte{1, 2, 3, 4})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, peft.ErrBusy) {
		t.Fatalf("call from the callback: %v, want ErrBusy", inner)
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
}

// Closing an unfinished writer discards its output and leaves no temporary.
func TestWriterCloseUnfinished(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "ckpt")
	w, err := peft.NewCheckpointWriter(out, 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		w.AddTensor(n, peft.F32, 4)
	}
	order, err := w.Order()
	if err != nil || len(order.Files) != 3 {
		t.Fatalf("order %+v, %v", order, err)
	}
	if err := w.WriteTensor(order.Names[0], peft.F32, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Close() // idempotent
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); !os.IsNotExist(err) {
		t.Fatal("an index was written")
	}
	noTemporaries(t, out)
	wantClosed(t, w.Finish())
	wantClosed(t, w.AddTensor("d", peft.F32))
	if _, err := w.Write(nil); !errors.Is(err, peft.ErrClosed) {
		t.Fatal(err)
	}
	if _, err := w.Order(); !errors.Is(err, peft.ErrClosed) {
		t.Fatal(err)
	}
	if w.TensorCount() != 0 {
		t.Fatal("TensorCount after Close")
	}
}

func wantClosed(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, peft.ErrClosed) {
		t.Fatalf("%v, want ErrClosed", err)
	}
}

// Names holding NUL bytes are declared, ordered, written by every way and read back whole.
func TestWriterNamesWithNUL(t *testing.T) {
	dir := t.TempDir()
	src := mustOpen(t, fixture("safetensors", "dtype_f32.safetensors"))
	si, _ := src.Find("values")
	path := filepath.Join(dir, "nul.safetensors")
	w, err := peft.NewWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	names := []string{"a\x00", "b\x00b", "c\x00\x00", "d\x00x", "e\x00"}
	for _, n := range names {
		if err := w.AddTensor(n, peft.F32, 3, 4); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, w.AddTensor("a\x00", peft.F32, 1), peft.CodeInvalidArgument) // duplicate
	order, err := w.Order()
	if err != nil || !slices.Equal(order.Names, names) {
		t.Fatalf("order %q, %v", order.Names, err)
	}
	data, _ := src.View(si)
	wantCode(t, w.WriteTensor("b\x00b", peft.F32, data), peft.CodeInvalidArgument) // not the next one
	wantCode(t, w.WriteTensor("a\x00z", peft.F32, data), peft.CodeInvalidArgument)
	steps := []func(name string) error{
		func(n string) error { return w.WriteTensor(n, peft.F32, data) },
		func(n string) error {
			if err := w.BeginTensor(n, peft.F32); err != nil {
				return err
			}
			_, err := w.Write(data)
			return err
		},
		func(n string) error {
			return w.WriteFrom(n, peft.F32, func(off uint64, dst []byte) error { copy(dst, data[off:]); return nil })
		},
		func(n string) error { return w.WriteFromCheckpoint(n, src, si) },
		func(n string) error { return w.WriteFromReader(n, peft.F32, bytes.NewReader(data)) },
	}
	for i, n := range names {
		if err := steps[i](n); err != nil {
			t.Fatalf("way %d, %q: %v", i, n, err)
		}
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, path)
	for _, n := range names {
		i, err := c.Find(n)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := c.Tensor(i)
		v, _ := c.View(i)
		if info.Name != n || !bytes.Equal(v, data) {
			t.Fatalf("%q read back as %q", n, info.Name)
		}
	}
}
