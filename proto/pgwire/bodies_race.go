//go:build race

package pgwire

// With the race detector on (make test), recycled bodies are overwritten,
// so that a payload still in use after Recycle shows as wrong bytes in every
// test that compares WAL.
const scribbleRecycled = true
