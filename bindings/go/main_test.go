package peftc_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	peftc "github.com/peft-c/peft_c/bindings/go"
)

// TestMain checks, after every test, that the binding has released every C object it created:
// closed handles at once, dropped ones through their runtime cleanup.
func TestMain(m *testing.M) {
	code := m.Run()
	for i := 0; i < 500 && peftc.LiveHandles() > 0; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if n := peftc.LiveHandles(); n != 0 {
		fmt.Fprintf(os.Stderr, "peftc: %d C objects were never released\n", n)
		code = 1
	}
	os.Exit(code)
}
