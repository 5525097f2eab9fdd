package peft

// LiveHandles is the number of C objects the binding owns and has not released (for tests).
func LiveHandles() int64 { return liveHandles.Load() }

// DebugGC reports whether the package was built with the "debug" tag (a GC in every call).
const DebugGC = debugGC
