//go:build !race

package pgwire

const scribbleRecycled = false
