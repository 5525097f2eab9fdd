// Command example opens a PEFT LoRA adapter, validates it against its base model, merges it into
// the base and exports it again, with the Go binding of peft_c.
//
//	go run . -base ../../tests/fixtures/models/llama -adapter ../../tests/fixtures/adapters/llama_lora
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"

	peft "github.com/peft-c/peft_c/bindings/go"
)

func main() {
	base := flag.String("base", "tests/fixtures/models/llama", "base model folder")
	adapterDir := flag.String("adapter", "tests/fixtures/adapters/llama_lora", "PEFT LoRA adapter folder")
	out := flag.String("out", "", "output folder (default: a new temporary folder)")
	flag.Parse()
	if *out == "" {
		dir, err := os.MkdirTemp("", "peftc-example-")
		if err != nil {
			log.Fatal(err)
		}
		*out = dir
	}

	// Open the adapter and look at it.
	adapter, err := peft.OpenAdapter(*adapterDir)
	if err != nil {
		log.Fatal(err)
	}
	defer adapter.Close()
	fmt.Printf("adapter %s: %s r=%d alpha=%g, %d modules, family %q\n", *adapterDir,
		adapter.PEFTType(), adapter.R(), adapter.LoraAlpha(), adapter.ModuleCount(), adapter.Family())

	// Validate it against the base: every module must find a base weight of a fitting shape.
	if err := adapter.Validate(*base); err != nil {
		var e *peft.Error
		if errors.As(err, &e) && (e.Code == peft.CodeShapeMismatch || e.Code == peft.CodeUnresolvedKey) {
			log.Fatalf("the adapter does not fit %s: %s", *base, e.Message)
		}
		log.Fatal(err)
	}
	fmt.Println("validated against", *base)

	// Merge it into the base, streaming; Ctrl-C cancels cleanly (the output folder is left as it was).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	merged := filepath.Join(*out, "merged")
	result, err := peft.MergeCheckpoint(ctx, *base, merged, peft.WithAdapter(adapter, 1.0),
		peft.WithProgress(func(done, total uint64) {
			if done == total {
				fmt.Printf("merged %d bytes\n", total)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s: %d tensors merged, %d copied, files %v\n", merged, result.Merged, result.Copied, result.Files)

	// Read one merged weight back, converted to float32.
	ckpt, err := peft.Open(merged)
	if err != nil {
		log.Fatal(err)
	}
	defer ckpt.Close()
	module, err := adapter.Module(0)
	if err != nil {
		log.Fatal(err)
	}
	index, err := ckpt.Find(module.Tensors[0].BaseName)
	if err != nil {
		log.Fatal(err)
	}
	values, err := ckpt.ReadFloat32(index)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s[0:4] = %v\n", module.Tensors[0].BaseName, values[:4])

	// Export the adapter as PEFT's save_pretrained writes it, in BF16.
	exported := filepath.Join(*out, "adapter")
	if err := adapter.Export(exported, peft.WithExportDType(peft.BF16)); err != nil {
		log.Fatal(err)
	}
	fmt.Println("exported the adapter to", exported)
}
