package sim

// The in-memory network. A connection is a TCP connection between a
// proposer and a safekeeper: each direction delivers its frames in order,
// never reorders, loses or duplicates within the connection on its own —
// faults are injected explicitly by the world (net faults in sim.go):
//
//   - cut (an RST, a partition, a crashed host): both directions lose every
//     frame in flight and both ends learn the connection is gone; nothing of
//     it is ever delivered afterwards;
//   - close by the proposer (it gave up on the connection, or ended its
//     session): what it already sent is still delivered, in order, then the
//     safekeeper reads EOF; what the safekeeper sends is discarded. This is
//     how a late ProposerElected or SafeKeeperRequest of an old connection
//     reaches a safekeeper after the proposer reconnected;
//   - duplicated frame (a misbehaving proxy): one frame is delivered twice;
//     the safekeeper's per-connection order rules must turn that into an
//     error, never into damage.
//
// Delay and reordering between connections come from the scheduler: every
// step delivers the head of a randomly chosen connection direction,
// weighted by the connection's speed.

// frame is one CopyData payload, or the end of a direction.
type frame struct {
	payload []byte // an encoded proto.Message
	eof     bool   // the sender closed its end (EOF)
	err     string // safekeeper → proposer: ErrorResponse, then close
	// code and detail are the ErrorResponse's SQLSTATE and Detail where
	// the server sets them from the error (server/errors.go): SK001 and
	// SK002 carry the safekeeper's configuration in Detail.
	code, detail string
}

type conn struct {
	id   int
	p, s int // proposer and safekeeper index

	toSK, toP    []frame
	pOpen, sOpen bool // each end still reads and writes
	// speed weighs the scheduler's choice of this connection's frames
	// (100 normal; 1..20 a slow, congested or far link): slow links are
	// how old messages arrive late, after a newer connection's.
	speed int

	// server side: dead once the safekeeper answered an error (it reads
	// nothing more but the end of the stream); eofQueued once that end is
	// in toSK.
	dead, eofQueued bool

	// gen is the generation of the configuration the proposer greeted
	// with on this connection (the checker's view of rule 9); create is
	// START_WAL_PUSH's allow_timeline_creation (README_PROTO.md, rule 1).
	gen    uint64
	create bool
}

func (c *conn) closed() bool { return !c.pOpen && !c.sOpen }
