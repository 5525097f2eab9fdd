// The drift check of the Go binding: every PEFT_API function of include/peft_c.h is called by the
// binding (through cgo in its .go files or from callbacks.c) or listed in notWrapped with the reason.
// cgo itself checks the types and argument counts of every call at compile time; this test checks
// coverage, and that each called function is one the header declares.

package peft_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// notWrapped lists the header functions the binding does not call, and why.
var notWrapped = map[string]string{
	"peft_checkpoint_find":   "the _n variant is called: Go strings may hold NUL bytes",
	"peft_writer_add_tensor": "the _n variant is called: Go strings may hold NUL bytes",
	"peft_get_api":           "the function table is for C callers that load the library by hand; cgo links by name",
	// Older aliases the header keeps beside the regular names (see its Conventions).
	"peft_lease_release":               "older alias of peft_lease_free; the binding calls the regular one",
	"peft_merge_buffer_remove":         "older alias of peft_merge_record_unmerge; the binding calls the regular one",
	"peft_registry_names":              "older alias of peft_registry_name_list; the binding calls the regular one",
	"peft_translator_builtin_families": "older alias of peft_translator_builtin_family_list; the binding calls the regular one",
}

var (
	commentRe   = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	prototypeRe = regexp.MustCompile(`(?s)PEFT_API\s+.+?\b(peft_\w+)\s*\(`)
	cCallRe     = regexp.MustCompile(`\b(peft_[a-z0-9_]+)\s*\(`)
)

// headerFunctions returns the names of the PEFT_API functions declared in a header's text.
func headerFunctions(text string) map[string]bool {
	text = commentRe.ReplaceAllString(text, " ")
	var code strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			code.WriteString(line + "\n")
		}
	}
	names := map[string]bool{}
	for _, statement := range strings.Split(code.String(), ";") {
		if m := prototypeRe.FindStringSubmatch(statement); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// boundFunctions returns the peft_* functions called in dir: C.peft_*(...) in the Go files (tests
// excluded) and peft_*(...) in the C files.
func boundFunctions(t *testing.T, dir string) map[string]bool {
	called := map[string]bool{}
	fset := token.NewFileSet()
	goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, path := range goFiles {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "C" && strings.HasPrefix(sel.Sel.Name, "peft_") {
						called[sel.Sel.Name] = true
					}
				}
			}
			return true
		})
	}
	cFiles, _ := filepath.Glob(filepath.Join(dir, "*.c"))
	for _, path := range cFiles {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cCallRe.FindAllStringSubmatch(commentRe.ReplaceAllString(string(text), " "), -1) {
			called[m[1]] = true
		}
	}
	return called
}

// compareCoverage lists every difference between the header's functions, the called ones and notWrapped.
func compareCoverage(header, called map[string]bool, skipped map[string]string) []string {
	var problems []string
	for name := range called {
		if !header[name] {
			problems = append(problems, name+" is called but not declared in the header")
		}
	}
	for name := range header {
		if _, listed := skipped[name]; !called[name] && !listed {
			problems = append(problems, name+" is in the header but neither called nor listed as not wrapped")
		}
	}
	for name := range skipped {
		if called[name] {
			problems = append(problems, name+" is called and also listed as not wrapped")
		}
		if !header[name] {
			problems = append(problems, name+" is listed as not wrapped but not in the header")
		}
	}
	sort.Strings(problems)
	return problems
}

func TestBindingCoversTheHeader(t *testing.T) {
	path := filepath.Join("..", "..", "include", "peft_c.h")
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	header := headerFunctions(string(text))
	// The parser must have found the API, or the comparison would prove nothing.
	if len(header) < 140 {
		t.Fatalf("only %d prototypes parsed from %s", len(header), path)
	}
	if problems := compareCoverage(header, boundFunctions(t, "."), notWrapped); len(problems) > 0 {
		t.Fatalf("%d difference(s):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
}

func TestCoverageCheckNoticesDifferences(t *testing.T) {
	dir := t.TempDir()
	source := "package x\n\n// C.peft_in_a_comment(\nfunc f() { C.peft_called(nil); g(C.peft_passed) }\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	cSource := "/* peft_in_a_c_comment( */ int y(void) { return peft_called_from_c(1); }\n"
	if err := os.WriteFile(filepath.Join(dir, "y.c"), []byte(cSource), 0o644); err != nil {
		t.Fatal(err)
	}
	called := boundFunctions(t, dir)
	if len(called) != 2 || !called["peft_called"] || !called["peft_called_from_c"] {
		t.Fatalf("calls found: %v", called)
	}
	header := headerFunctions(`
		#define PEFT_API __attribute__((visibility("default")))
		/** peft_documented(void); */
		PEFT_API peft_error* peft_called(const peft_thing* thing,
		                                 size_t n);
		PEFT_API void peft_missing(void);
		PEFT_API void peft_skipped(void);`)
	if len(header) != 3 || !header["peft_called"] || !header["peft_missing"] || !header["peft_skipped"] {
		t.Fatalf("header functions: %v", header)
	}
	problems := compareCoverage(header, called, map[string]string{"peft_skipped": "test", "peft_gone": "test"})
	want := []string{
		"peft_called_from_c is called but not declared in the header",
		"peft_gone is listed as not wrapped but not in the header",
		"peft_missing is in the header but neither called nor listed as not wrapped",
	}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s", strings.Join(problems, "\n"))
	}
}
