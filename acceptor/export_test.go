package acceptor

// Exports for the planted-bug test (planted_test.go, package acceptor_test),
// which drives the deterministic simulation with a bug planted through the
// unexported hooks. Compiled into tests only.

// PlantedBug names a bug of hooks.go.
type PlantedBug int

const (
	// SkipCommonPointCheck plants hooks.skipCommonPointCheck.
	SkipCommonPointCheck PlantedBug = iota + 1
	// ReplyBeforeFlush plants hooks.replyBeforeFlush.
	ReplyBeforeFlush
	// AcceptOlderGeneration plants hooks.acceptOlderGeneration.
	AcceptOlderGeneration
)

func (b PlantedBug) String() string {
	return [...]string{"?", "SkipCommonPointCheck", "ReplyBeforeFlush", "AcceptOlderGeneration"}[b]
}

// NewPlantedSession returns NewSession with bug planted.
func NewPlantedSession(bug PlantedBug) func(Config, State, Storage) (*Session, error) {
	var h hooks
	switch bug {
	case SkipCommonPointCheck:
		h.skipCommonPointCheck = true
	case ReplyBeforeFlush:
		h.replyBeforeFlush = true
	case AcceptOlderGeneration:
		h.acceptOlderGeneration = true
	}
	return func(cfg Config, st State, store Storage) (*Session, error) { return newSession(cfg, st, store, h) }
}
