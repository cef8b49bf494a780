// Package proposer is the walproposer: the client side of the WAL push
// protocol. Conn is one START_WAL_PUSH stream to a safekeeper.
package proposer
