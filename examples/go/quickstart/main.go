// Command quickstart merges a PEFT LoRA adapter into its base model: quickstart BASE ADAPTER OUT.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	peft "github.com/peft-c/peft_c/bindings/go"
)

func main() {
	result, err := peft.MergeCheckpoint(context.Background(), os.Args[1], os.Args[3], peft.WithAdapterDir(os.Args[2], 1.0))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("merged", result.Merged, "tensors into", os.Args[3])
}
