//go:build !debug

package peftc

// debugGC makes every call collect garbage right after taking its C pointer (build tag "debug").
const debugGC = false
