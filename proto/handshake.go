package proto

import (
	"fmt"
)

// ServerInfo ('i') is the proposer's greeting: who it is and which timeline
// of which PostgreSQL cluster it pushes.
type ServerInfo struct {
	ProtocolVersion uint32 // must be ProtocolVersion
	PgVersion       uint32 // PG_VERSION_NUM of the primary, e.g. 150018
	SystemID        uint64 // the primary's database system identifier
	TenantID        ID
	TimelineID      ID     // Neon timeline id (not the PostgreSQL TLI)
	PgTimeline      uint32 // PostgreSQL timeline id (TLI)
	WalSegSize      uint32 // WAL segment size in bytes: power of two, 1 MiB..1 GiB
	ProposerUUID    ID
	WalEnd          LSN // proposer's current end of WAL; informational
	// Configuration is the timeline's membership as the proposer knows it
	// (generation 0: it knows none). A safekeeper on an older generation
	// switches to it; the connection acts in its generation
	// (README_PROTO.md, "Membership and generations").
	Configuration Configuration
}

func (*ServerInfo) Tag() byte { return TagServerInfo }

func (m *ServerInfo) Encode(b []byte) []byte {
	b = append(b, TagServerInfo)
	b = putU32(b, m.ProtocolVersion)
	b = putU32(b, m.PgVersion)
	b = putU64(b, m.SystemID)
	b = putID(b, m.TenantID)
	b = putID(b, m.TimelineID)
	b = putU32(b, m.PgTimeline)
	b = putU32(b, m.WalSegSize)
	b = putID(b, m.ProposerUUID)
	b = putLSN(b, m.WalEnd)
	return putConfiguration(b, m.Configuration)
}

func (m *ServerInfo) Decode(src []byte) error {
	r := newReader(src, TagServerInfo, "ServerInfo")
	m.ProtocolVersion = r.u32()
	if r.err == nil && m.ProtocolVersion != ProtocolVersion {
		// Checked first: an older proposer's greeting has another layout.
		return m.versionError()
	}
	m.PgVersion = r.u32()
	m.SystemID = r.u64()
	m.TenantID = r.id()
	m.TimelineID = r.id()
	m.PgTimeline = r.u32()
	m.WalSegSize = r.u32()
	m.ProposerUUID = r.id()
	m.WalEnd = r.lsn()
	m.Configuration = r.configuration()
	if err := r.done(); err != nil {
		return err
	}
	return m.Validate()
}

func (m *ServerInfo) versionError() error {
	return fmt.Errorf("%w: ServerInfo: protocol_version %d, this safekeeper speaks %d (README_PROTO.md): upgrade the proposer", ErrMalformed, m.ProtocolVersion, ProtocolVersion)
}

// Validate checks the field values a safekeeper relies on.
func (m *ServerInfo) Validate() error {
	if m.ProtocolVersion != ProtocolVersion {
		return m.versionError()
	}
	if err := m.Configuration.Validate(); err != nil {
		return fmt.Errorf("%w: ServerInfo: configuration: %v", ErrMalformed, err)
	}
	if !ValidSegSize(m.WalSegSize) {
		return fmt.Errorf("%w: ServerInfo: wal_seg_size %d is not a power of two from 1 MiB to 1 GiB", ErrMalformed, m.WalSegSize)
	}
	if m.PgTimeline == 0 {
		return fmt.Errorf("%w: ServerInfo: pg_timeline 0 is invalid", ErrMalformed)
	}
	return nil
}

// ValidSegSize reports whether s is a power of two from 1 MiB to 1 GiB, the
// WAL segment sizes PostgreSQL accepts.
func ValidSegSize(s uint32) bool {
	return s >= 1<<20 && s <= 1<<30 && s&(s-1) == 0
}

// SafeKeeperInfo ('I') is a safekeeper's state report: sent in answer to
// ServerInfo, and again right after a granted vote.
type SafeKeeperInfo struct {
	ProtocolVersion  uint32
	SafekeeperID     uint64 // this server's configured node id
	VotedFor         Ballot // Term 0: never voted
	LastLogTerm      uint64 // term of the last history entry with start_lsn ≤ flush_lsn; 0 if none
	FlushLSN         LSN    // end of the last complete durable record
	CommitLSN        LSN
	TruncateLSN      LSN
	TimelineStartLSN LSN         // 0: the timeline has no WAL yet
	History          TermHistory // cut at FlushLSN
	// Configuration is the timeline's membership as this safekeeper holds
	// it (generation 0: none).
	Configuration Configuration
}

func (*SafeKeeperInfo) Tag() byte { return TagSafeKeeperInfo }

func (m *SafeKeeperInfo) Encode(b []byte) []byte {
	b = append(b, TagSafeKeeperInfo)
	b = putU32(b, m.ProtocolVersion)
	b = putU64(b, m.SafekeeperID)
	b = putBallot(b, m.VotedFor)
	b = putU64(b, m.LastLogTerm)
	b = putLSN(b, m.FlushLSN)
	b = putLSN(b, m.CommitLSN)
	b = putLSN(b, m.TruncateLSN)
	b = putLSN(b, m.TimelineStartLSN)
	b = putHistory(b, m.History)
	return putConfiguration(b, m.Configuration)
}

func (m *SafeKeeperInfo) Decode(src []byte) error {
	r := newReader(src, TagSafeKeeperInfo, "SafeKeeperInfo")
	m.ProtocolVersion = r.u32()
	m.SafekeeperID = r.u64()
	m.VotedFor = r.ballot()
	m.LastLogTerm = r.u64()
	m.FlushLSN = r.lsn()
	m.CommitLSN = r.lsn()
	m.TruncateLSN = r.lsn()
	m.TimelineStartLSN = r.lsn()
	m.History = r.history()
	m.Configuration = r.configuration()
	return r.done()
}
