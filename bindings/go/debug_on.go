//go:build debug

package peft

// debugGC makes calls collect garbage right after taking their C pointer, so a missing
// runtime.KeepAlive or a handle released too early shows up as a failure (build tag "debug").
const debugGC = true
