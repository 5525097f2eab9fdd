package peft_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// A fixture case as the generator recorded it from the reference reader (tests/fixtures/README.md).
type fixtureCase struct {
	Metadata map[string]string `json:"metadata"`
	Tensors  []fixtureTensor   `json:"tensors"`
}

type fixtureTensor struct {
	Name        string    `json:"name"`
	DType       string    `json:"dtype"`
	Shape       []uint64  `json:"shape"`
	DataOffsets [2]uint64 `json:"data_offsets"`
	SHA256      string    `json:"sha256"`
	F64         []any     `json:"f64"`
}

type fixtureFolder struct {
	Files map[string]fixtureCase `json:"files"`
	Index json.RawMessage        `json:"index"`
}

// The three ways of opening one file.
var openModes = []struct {
	name string
	open func(path string) (*peft.Checkpoint, error)
}{
	{"mmap", func(p string) (*peft.Checkpoint, error) { return peft.Open(p) }},
	{"pread", func(p string) (*peft.Checkpoint, error) { return peft.Open(p, peft.WithPread(true)) }},
	{"memory", func(p string) (*peft.Checkpoint, error) {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		return peft.OpenBytes(data)
	}},
}

func fileCases(t *testing.T) []string {
	matches, err := filepath.Glob(fixture("safetensors", "*.safetensors"))
	if err != nil || len(matches) < 40 {
		t.Fatalf("fixtures missing: %d files (%v)", len(matches), err)
	}
	return matches
}

// Every valid fixture file, opened three ways, shows what the reference reader showed.
func TestCheckpointMatchesReference(t *testing.T) {
	for _, path := range fileCases(t) {
		var want fixtureCase
		readJSON(t, strings.TrimSuffix(path, ".safetensors")+".json", &want)
		for _, mode := range openModes {
			t.Run(filepath.Base(path)+"/"+mode.name, func(t *testing.T) {
				c, err := mode.open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				gcPoint()
				checkFile(t, c, 0, want)
			})
		}
	}
}

// checkFile compares file `file` of a checkpoint with a fixture case.
func checkFile(t *testing.T, c *peft.Checkpoint, file int, want fixtureCase) {
	t.Helper()
	meta, err := c.Metadata(file)
	if err != nil {
		t.Fatal(err)
	}
	if (meta == nil) != (want.Metadata == nil) || len(meta) != len(want.Metadata) {
		t.Fatalf("metadata %v, want %v", meta, want.Metadata)
	}
	for k, v := range want.Metadata {
		if meta[k] != v {
			t.Fatalf("metadata[%q] = %q, want %q", k, meta[k], v)
		}
	}
	infos, err := c.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	var inFile []peft.TensorInfo
	for _, info := range infos {
		if info.File == file {
			inFile = append(inFile, info)
		}
	}
	if len(inFile) != len(want.Tensors) {
		t.Fatalf("%d tensors, want %d", len(inFile), len(want.Tensors))
	}
	// Tensors are numbered in data order within a file.
	for i := 1; i < len(inFile); i++ {
		if inFile[i].DataOffsets[0] < inFile[i-1].DataOffsets[0] {
			t.Fatalf("tensor %q before %q is not in data order", inFile[i-1].Name, inFile[i].Name)
		}
	}
	for _, wt := range want.Tensors {
		gcPoint()
		wantName := wt.Name // names may hold NUL bytes (escaped_names): they must come through whole
		index, err := c.Find(wt.Name)
		if err != nil {
			t.Fatalf("Find(%q): %v", wt.Name, err)
		}
		info, err := c.Tensor(index)
		if err != nil {
			t.Fatal(err)
		}
		if info.Name != wantName || info.DType.String() != wt.DType || !slices.Equal(info.Shape, wt.Shape) ||
			info.DataOffsets != wt.DataOffsets || info.File != file || info.Index != index {
			t.Fatalf("tensor %+v, want %+v", info, wt)
		}
		view, err := c.View(index)
		if err != nil {
			t.Fatal(err)
		}
		gcPoint() // the checkpoint is still reachable (deferred Close): the view must stay valid
		sum := sha256.Sum256(view)
		if hex.EncodeToString(sum[:]) != wt.SHA256 || uint64(len(view)) != info.NumBytes() {
			t.Fatalf("tensor %q: view bytes differ from the reference", wt.Name)
		}
		checkValues(t, c, index, info, wt)
	}
}

// checkValues compares ReadFloat64 with the reference's f64 values, where the conversion exists.
func checkValues(t *testing.T, c *peft.Checkpoint, index int, info peft.TensorInfo, wt fixtureTensor) {
	t.Helper()
	got, err := c.ReadFloat64(index)
	// The header promises these conversions; others are either done or ErrUnsupported.
	promised := map[peft.DType]bool{peft.F64: true, peft.F32: true, peft.F16: true, peft.BF16: true,
		peft.F8E4M3: true, peft.F8E5M2: true, peft.Bool: true, peft.U8: true, peft.I8: true,
		peft.I16: true, peft.U16: true, peft.I32: true, peft.U32: true, peft.I64: true, peft.U64: true}
	if err != nil {
		if promised[info.DType] || !errors.Is(err, peft.ErrUnsupported) {
			t.Fatalf("ReadFloat64(%q) of %s: %v", wt.Name, info.DType, err)
		}
		return
	}
	if wt.F64 == nil {
		return
	}
	if len(got) != len(wt.F64) {
		t.Fatalf("%q: %d values, want %d", wt.Name, len(got), len(wt.F64))
	}
	for i, w := range wt.F64 {
		if !sameFloat(got[i], fixtureFloat(w)) {
			t.Fatalf("%q[%d] = %v, want %v", wt.Name, i, got[i], w)
		}
	}
	// float32 reads agree with the float64 reads rounded to float32.
	f32, err := c.ReadFloat32(index)
	if err != nil {
		t.Fatal(err)
	}
	for i := range f32 {
		if info.DType != peft.F64 && info.DType != peft.I64 && info.DType != peft.U64 &&
			info.DType != peft.I32 && info.DType != peft.U32 && !sameFloat(float64(f32[i]), got[i]) {
			t.Fatalf("%q[%d]: float32 %v, float64 %v", wt.Name, i, f32[i], got[i])
		}
	}
}

func fixtureFloat(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		switch x {
		case "nan":
			return math.NaN()
		case "inf":
			return math.Inf(1)
		case "-inf":
			return math.Inf(-1)
		}
	}
	panic("unexpected fixture value")
}

// sameFloat compares bit for bit (signed zeros included), NaNs as "is NaN".
func sameFloat(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Float64bits(a) == math.Float64bits(b)
}

// Checkpoint folders: sharded (transformers), sharded by huggingface_hub, and one model.safetensors.
func TestCheckpointFolders(t *testing.T) {
	for _, name := range []string{"sharded", "sharded_hub", "single"} {
		t.Run(name, func(t *testing.T) {
			var want fixtureFolder
			readJSON(t, fixture("safetensors", name+".json"), &want)
			for _, pread := range []bool{false, true} {
				c := mustOpen(t, fixture("safetensors", name), peft.WithPread(pread))
				files, err := c.Files()
				if err != nil {
					t.Fatal(err)
				}
				if len(files) != len(want.Files) || c.FileCount() != len(files) {
					t.Fatalf("files %v, want %d", files, len(want.Files))
				}
				total := 0
				for i, f := range files {
					wc, ok := want.Files[filepath.Base(f)]
					if !ok {
						t.Fatalf("unexpected file %s", f)
					}
					checkFile(t, c, i, wc)
					total += len(wc.Tensors)
				}
				if c.TensorCount() != total {
					t.Fatalf("%d tensors, want %d", c.TensorCount(), total)
				}
				indexMeta, ok, err := c.IndexMetadataJSON()
				if err != nil {
					t.Fatal(err)
				}
				var index struct {
					Metadata map[string]any `json:"metadata"`
				}
				if string(want.Index) != "null" {
					if err := json.Unmarshal(want.Index, &index); err != nil {
						t.Fatal(err)
					}
				}
				if ok != (index.Metadata != nil) {
					t.Fatalf("index metadata present = %v, want %v", ok, index.Metadata != nil)
				}
				if ok {
					var got map[string]any
					if err := json.Unmarshal([]byte(indexMeta), &got); err != nil {
						t.Fatal(err)
					}
					if len(got) != len(index.Metadata) || got["total_size"] != index.Metadata["total_size"] {
						t.Fatalf("index metadata %v, want %v", got, index.Metadata)
					}
				}
			}
		})
	}
}

func TestOpenBytesCopiesTheInput(t *testing.T) {
	data, err := os.ReadFile(fixture("safetensors", "dtype_f32.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := peft.OpenBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	i, _ := c.Find("values")
	before, _ := c.ReadFloat32(i)
	clear(data)
	gcPoint()
	after, err := c.ReadFloat32(i)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(before, after, func(a, b float32) bool { return sameFloat(float64(a), float64(b)) }) {
		t.Fatal("the checkpoint changed with the caller's buffer")
	}
	files, _ := c.Files()
	if len(files) != 1 {
		t.Fatalf("files %v", files)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := peft.Open(filepath.Join(dir, "absent.safetensors"))
	wantCode(t, err, peft.CodeIO)
	if !strings.Contains(err.Error(), "absent.safetensors") {
		t.Errorf("message does not name the file: %v", err)
	}
	_, err = peft.Open(dir) // a folder without a checkpoint
	var e *peft.Error
	if !errors.As(err, &e) || (e.Code != peft.CodeInvalidCheckpoint && e.Code != peft.CodeIO && e.Code != peft.CodeNotFound) {
		t.Fatalf("empty folder: %v", err)
	}
	_, err = peft.Open("a\x00b")
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.OpenBytes(nil)
	wantCode(t, err, peft.CodeHeaderTooSmall)
	_, err = peft.OpenBytes([]byte{})
	wantCode(t, err, peft.CodeHeaderTooSmall)
}

func TestMaxHeaderSize(t *testing.T) {
	path := fixture("safetensors", "dtype_f32.safetensors")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(data[0]) | uint64(data[1])<<8 | uint64(data[2])<<16 | uint64(data[3])<<24
	c, err := peft.Open(path, peft.WithMaxHeaderSize(n)) // exactly the cap is allowed
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_, err = peft.Open(path, peft.WithMaxHeaderSize(n-1))
	wantCode(t, err, peft.CodeHeaderTooLarge)
	_, err = peft.OpenBytes(data, peft.WithMaxHeaderSize(n-1))
	wantCode(t, err, peft.CodeHeaderTooLarge)
}

func TestCheckpointLookupErrors(t *testing.T) {
	c := mustOpen(t, fixture("safetensors", "dtype_f32.safetensors"))
	_, err := c.Find("absent")
	wantCode(t, err, peft.CodeNotFound)
	if !strings.Contains(err.Error(), "absent") {
		t.Errorf("message does not name the tensor: %v", err)
	}
	_, err = c.Find("values\x00")
	wantCode(t, err, peft.CodeNotFound)
	for _, bad := range []int{-1, c.TensorCount(), 1 << 40} {
		_, err = c.Tensor(bad)
		wantCode(t, err, peft.CodeInvalidArgument)
		_, err = c.View(bad)
		wantCode(t, err, peft.CodeInvalidArgument)
		wantCode(t, c.ReadInto(bad, peft.F32, make([]byte, 4)), peft.CodeInvalidArgument)
		_, err = c.ReadFloat32(bad)
		wantCode(t, err, peft.CodeInvalidArgument)
	}
	_, err = c.TensorByName("absent")
	wantCode(t, err, peft.CodeNotFound)
	_, err = c.Metadata(1)
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = c.Metadata(-1)
	wantCode(t, err, peft.CodeInvalidArgument)
	i, _ := c.Find("values")
	// ReadInto checks the destination size.
	wantCode(t, c.ReadInto(i, peft.F32, make([]byte, 47)), peft.CodeInvalidArgument)
	wantCode(t, c.ReadInto(i, peft.F32, nil), peft.CodeInvalidArgument)
	if err := c.ReadInto(i, peft.F16, make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.ReadInto(i, peft.DType(99), make([]byte, 48)), peft.CodeInvalidArgument)
	_, err = c.Read(i, peft.C64)
	wantCode(t, err, peft.CodeUnsupported)
	got, err := c.Read(i, peft.F32)
	if err != nil {
		t.Fatal(err)
	}
	view, _ := c.View(i)
	if !bytes.Equal(got, view) {
		t.Fatal("Read as the stored dtype differs from the view")
	}
}

func TestZeroSizeTensors(t *testing.T) {
	c := mustOpen(t, fixture("safetensors", "zero_size.safetensors"))
	infos, err := c.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	zeros := 0
	for _, info := range infos {
		if info.NumElements() != 0 {
			continue
		}
		zeros++
		v, err := c.View(info.Index)
		if err != nil || v == nil || len(v) != 0 {
			t.Fatalf("view of %q: %v %v", info.Name, v, err)
		}
		f, err := c.ReadFloat32(info.Index)
		if err != nil || len(f) != 0 {
			t.Fatalf("read of %q: %v %v", info.Name, f, err)
		}
	}
	if zeros == 0 {
		t.Fatal("the fixture has no zero-size tensor")
	}
}
