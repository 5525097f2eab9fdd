module github.com/peft-c/peft_c/bindings/go

go 1.24
