// Package remote is the object storage the WAL archive lives in: one
// small interface (Storage: create an object once, read a range of it,
// list, delete) and its backends, chosen by URL (Open).
//
// Objects are named by slash-separated keys relative to the store's root
// (the URL's path, or a bucket's prefix): "tenant/timeline/000000010000000000000003".
// An object is created once and never changed: Create refuses a name that
// exists (ErrExists), so two writers of the same name cannot overwrite each
// other, and a reader sees an object whole or not at all.
package remote
