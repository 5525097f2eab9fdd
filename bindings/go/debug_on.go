//go:build debug

package peftc

// debugGC makes every call collect garbage right after taking its C pointer, so a missing
// runtime.KeepAlive or a handle released too early shows up as a failure (build tag "debug").
const debugGC = true
