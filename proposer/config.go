package proposer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// Config configures Run. Zero fields get the defaults named below
// (withDefaults); Upstream, Safekeepers, TenantID and TimelineID are required.
type Config struct {
	// Upstream is the libpq keyword/value (or URL) connection string of the
	// primary, with libpq 15's keywords only (CheckConnString; Run refuses
	// others at once). Run adds replication=true and application_name
	// itself.
	Upstream string
	// Safekeepers are the host:port addresses of all safekeepers of the
	// timeline; a quorum is ⌊n/2⌋+1 of them.
	Safekeepers []string
	// TenantID and TimelineID name the timeline on the safekeepers.
	TenantID, TimelineID proto.ID
	// Configuration is the timeline's configuration (README_PROTO.md,
	// "Membership and generations"): an election and a commit need a
	// majority of its members and, during a change, of its new members,
	// by safekeeper_id. Generation 0 (the zero value): none, a quorum is a
	// majority of Safekeepers. A safekeeper that holds a newer one makes
	// Run propose in that one, to the same addresses.
	Configuration proto.Configuration
	// SafekeeperIDs, when set, are the safekeeper_id expected at each of
	// Safekeepers (0: any): another answering there does not count.
	SafekeeperIDs []uint64
	// Create lets the greetings create the timeline on safekeepers that do
	// not hold it: set it for a new timeline's first start only. Without it
	// a greeting creates the timeline on a safekeeper only after another
	// safekeeper answered that it holds it (a replaced disk joins), and Run
	// ends with ErrNoTimeline once a quorum answered that they do not: a
	// mistyped id must not fork the WAL onto a new timeline.
	Create bool
	// SlotName is the physical replication slot on the primary (created with
	// RESERVE_WAL if missing) that keeps WAL the safekeepers may still need.
	// Default DefaultName(TimelineID).
	SlotName string
	// ApplicationName is the application_name the proposer connects to the
	// primary with; synchronous_standby_names must name it for commits to
	// wait for quorum durability. Default DefaultName(TimelineID).
	ApplicationName string
	// ProposerUUID owns the proposer's terms. Default: random per Run.
	ProposerUUID proto.ID
	// Logger receives progress and failures. nil means discard.
	Logger *slog.Logger
	// HeartbeatInterval is how long a safekeeper with nothing to send waits
	// before it gets a heartbeat (a SafeKeeperRequest with begin = end)
	// carrying commit_lsn and truncate_lsn. An advanced commit_lsn is sent
	// at once, in the pass that saw a quorum reach it (at most one such
	// heartbeat unanswered per safekeeper; a changed truncate_lsn waits for
	// the next 50 ms tick). Default 200 ms.
	HeartbeatInterval time.Duration
	// StatusInterval is the longest time between two standby status updates
	// to the primary (it also gets one at once when commit_lsn advances or a
	// keepalive asks for a reply). Must stay below the primary's
	// wal_sender_timeout. Default 2 s.
	StatusInterval time.Duration
	// BufferSize bounds the in-memory WAL buffer kept for safekeepers that
	// lag or reconnect. A safekeeper needing older WAL is fed by a separate
	// replication connection to the primary. Default 64 MiB.
	BufferSize int
	// MaxInFlight is how many SafeKeeperRequests may await their response
	// per safekeeper (pipelining depth). Default 256.
	MaxInFlight int
	// MaxInFlightBytes bounds the WAL sent to a safekeeper beyond its last
	// answered request, which it has not yet reported durable
	// (session.Config.MaxInFlightBytes): a proposer
	// catching up keeps the safekeepers' disk queues short enough that
	// each answers within the protocol's 100 ms. Default 4 MiB.
	MaxInFlightBytes int
	// ConnectTimeout bounds each connection attempt. Default 10 s.
	ConnectTimeout time.Duration
	// Security: how to connect to the safekeepers (sslmode, sslrootcert,
	// password).
	Security Security
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// connection attempts (primary and safekeepers). Defaults 100 ms and
	// 1 s (Neon's wal_acceptor_reconnect_timeout). A safekeeper's backoff
	// starts over only after a connection that lasted ReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
	// ElectionTimeout is how long a session waits for a quorum of grants
	// before it gives up and starts over with a new term. Default 30 s.
	ElectionTimeout time.Duration
	// Stats, when set, is where Run shows its state for monitoring
	// (NewStats with these Safekeepers); nil: Run keeps its own.
	Stats *Stats
	// OwnTerm is the highest term an earlier Run of this same proposer
	// owned (a caller that restarts Run, as propose --etcd-endpoints does
	// on a new configuration): a proposer streaming in that term or below
	// is this one, not another to wait for (ProposerLease). 0: none.
	OwnTerm uint64
	// ProposerLease: before each campaign Run asks the safekeepers whether
	// a proposer of a higher term than its own last one streamed to the
	// timeline this recently, over a connection still open, and waits while
	// one does — so two supervised proposers do not depose each other in
	// turn. Default DefaultProposerLease; negative: never wait (take over
	// at once).
	ProposerLease time.Duration
}

// DefaultName is the default slot name and application_name of the
// proposer of timeline: "proposer_" and its 32 hex digits (41 bytes, within
// PostgreSQL's 63). Proposers of two timelines on one primary, or one
// started with a mistyped id, never share a slot or a synchronous standby
// name by default: the mistyped one is not the synchronous standby the
// primary waits for.
func DefaultName(timeline proto.ID) string { return "proposer_" + timeline.String() }

func (c Config) withDefaults() (Config, error) {
	if c.SlotName == "" {
		c.SlotName = DefaultName(c.TimelineID)
	}
	if c.ApplicationName == "" {
		c.ApplicationName = DefaultName(c.TimelineID)
	}
	if c.ProposerUUID.IsZero() {
		if _, err := io.ReadFull(rand.Reader, c.ProposerUUID[:]); err != nil {
			return c, err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatInterval, 200*time.Millisecond)
	def(&c.StatusInterval, 2*time.Second)
	def(&c.ConnectTimeout, 10*time.Second)
	def(&c.ReconnectMin, defaultReconnectMin)
	def(&c.ReconnectMax, defaultReconnectMax)
	def(&c.ElectionTimeout, 30*time.Second)
	def(&c.ProposerLease, DefaultProposerLease)
	if c.BufferSize == 0 {
		c.BufferSize = 64 << 20
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.MaxInFlightBytes == 0 {
		c.MaxInFlightBytes = session.DefaultMaxInFlightBytes
	}
	switch {
	case c.Upstream == "":
		return c, errors.New("proposer: Config.Upstream is empty")
	case len(c.Safekeepers) == 0:
		return c, errors.New("proposer: Config.Safekeepers is empty")
	case c.TenantID.IsZero() || c.TimelineID.IsZero():
		return c, errors.New("proposer: Config.TenantID and TimelineID are required")
	case c.BufferSize < proto.MaxWALPerRequest:
		return c, fmt.Errorf("proposer: Config.BufferSize %d is below %d", c.BufferSize, proto.MaxWALPerRequest)
	case c.MaxInFlight < 1:
		return c, fmt.Errorf("proposer: Config.MaxInFlight %d is below 1", c.MaxInFlight)
	case c.MaxInFlightBytes < 1:
		return c, fmt.Errorf("proposer: Config.MaxInFlightBytes %d is below 1", c.MaxInFlightBytes)
	case c.HeartbeatInterval < 0 || c.StatusInterval < 0 || c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin:
		return c, errors.New("proposer: negative or inverted intervals in Config")
	case c.Configuration.Validate() != nil:
		return c, fmt.Errorf("proposer: Config.Configuration: %v", c.Configuration.Validate())
	case c.SafekeeperIDs != nil && len(c.SafekeeperIDs) != len(c.Safekeepers):
		return c, fmt.Errorf("proposer: Config.SafekeeperIDs lists %d ids for %d safekeepers", len(c.SafekeeperIDs), len(c.Safekeepers))
	case c.Stats != nil && len(c.Stats.links) != len(c.Safekeepers):
		return c, fmt.Errorf("proposer: Config.Stats is for %d safekeepers, Config.Safekeepers lists %d", len(c.Stats.links), len(c.Safekeepers))
	}
	if c.Stats == nil {
		c.Stats = NewStats(c.Safekeepers)
	}
	return c, nil
}

// The defaults of Config.ReconnectMin and ReconnectMax.
const (
	defaultReconnectMin = 100 * time.Millisecond
	defaultReconnectMax = time.Second
)

// backoff is an exponential delay between min and max.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }
