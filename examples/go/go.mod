module github.com/peft-c/peft_c/examples/go

go 1.24

require github.com/peft-c/peft_c v0.0.0

replace github.com/peft-c/peft_c => ../..
