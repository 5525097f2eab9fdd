//go:build !debug

package peft

// debugGC makes calls collect garbage right after taking their C pointer (build tag "debug").
const debugGC = false
