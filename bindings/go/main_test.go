package peft_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// TestMain checks, after every test, that the binding has released every C object it created:
// closed handles at once, dropped ones through their runtime cleanup.
func TestMain(m *testing.M) {
	code := m.Run()
	for i := 0; i < 500 && peft.LiveHandles() > 0; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if n := peft.LiveHandles(); n != 0 {
		fmt.Fprintf(os.Stderr, "peft: %d C objects were never released\n", n)
		code = 1
	}
	os.Exit(code)
}
