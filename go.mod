// The Go module is the repository root, so that the binding's bundled build (-tags peftc_bundled)
// can compile the C++ sources under src/: a module holds only the files under its go.mod. The
// package is github.com/peft-c/peft_c/bindings/go (bindings/go); see bindings/go/README.md.
module github.com/peft-c/peft_c

go 1.24
