package proto

import "fmt"

// SafeKeeperRequest ('a', Neon's AppendRequest) carries WAL from BeginLSN to
// EndLSN and the proposer's commit_lsn and truncate_lsn. BeginLSN == EndLSN is
// a heartbeat.
type SafeKeeperRequest struct {
	Sender      Ballot
	BeginLSN    LSN
	EndLSN      LSN
	CommitLSN   LSN
	TruncateLSN LSN
	// WAL holds exactly EndLSN-BeginLSN bytes (at most MaxWALPerRequest).
	// After Decode it aliases the decoded payload.
	WAL []byte
}

func (*SafeKeeperRequest) Tag() byte { return TagSafeKeeperRequest }

func (m *SafeKeeperRequest) Encode(b []byte) []byte {
	b = append(b, TagSafeKeeperRequest)
	b = putBallot(b, m.Sender)
	b = putLSN(b, m.BeginLSN)
	b = putLSN(b, m.EndLSN)
	b = putLSN(b, m.CommitLSN)
	b = putLSN(b, m.TruncateLSN)
	return append(b, m.WAL...)
}

func (m *SafeKeeperRequest) Decode(src []byte) error {
	r := newReader(src, TagSafeKeeperRequest, "SafeKeeperRequest")
	m.Sender = r.ballot()
	m.BeginLSN = r.lsn()
	m.EndLSN = r.lsn()
	m.CommitLSN = r.lsn()
	m.TruncateLSN = r.lsn()
	if r.err != nil {
		return r.err
	}
	if m.EndLSN < m.BeginLSN {
		return fmt.Errorf("%w: SafeKeeperRequest: end_lsn %s before begin_lsn %s", ErrMalformed, m.EndLSN, m.BeginLSN)
	}
	n := uint64(m.EndLSN - m.BeginLSN)
	if n > MaxWALPerRequest {
		return fmt.Errorf("%w: SafeKeeperRequest: %d bytes of WAL, at most %d allowed", ErrMalformed, n, MaxWALPerRequest)
	}
	if uint64(len(r.b)) != n {
		return fmt.Errorf("%w: SafeKeeperRequest: %s..%s needs %d bytes of WAL, payload has %d", ErrMalformed, m.BeginLSN, m.EndLSN, n, len(r.b))
	}
	m.WAL = r.b
	return nil
}

// HotStandbyFeedback is the aggregate of the 'h' messages of the replicas
// reading a timeline: min xmin, min catalog_xmin, max ts. All zero when none.
type HotStandbyFeedback struct {
	TS          int64 // µs since 2000-01-01 00:00:00 UTC
	Xmin        uint64
	CatalogXmin uint64
}

// ConsumerFeedback is what the most advanced pageserver-style consumer
// reported ('z' message; Neon's PageserverFeedback). All zero when none.
type ConsumerFeedback struct {
	TimelineSize        uint64 // current_timeline_size, bytes
	ReceivedLSN         LSN    // ps_writelsn
	DiskConsistentLSN   LSN    // ps_flushlsn
	RemoteConsistentLSN LSN    // ps_applylsn
	ReplyTime           int64  // ps_replytime, µs since 2000-01-01
}

// SafeKeeperResponse ('r', Neon's AppendResponse) acknowledges one
// SafeKeeperRequest once its WAL is durable.
type SafeKeeperResponse struct {
	Term       uint64 // this safekeeper's voted_for.term; above the sender's: deposed
	FlushLSN   LSN
	CommitLSN  LSN
	HotStandby HotStandbyFeedback
	Consumer   ConsumerFeedback
}

func (*SafeKeeperResponse) Tag() byte { return TagSafeKeeperResponse }

func (m *SafeKeeperResponse) Encode(b []byte) []byte {
	b = append(b, TagSafeKeeperResponse)
	b = putU64(b, m.Term)
	b = putLSN(b, m.FlushLSN)
	b = putLSN(b, m.CommitLSN)
	b = putU64(b, uint64(m.HotStandby.TS))
	b = putU64(b, m.HotStandby.Xmin)
	b = putU64(b, m.HotStandby.CatalogXmin)
	b = putU64(b, m.Consumer.TimelineSize)
	b = putLSN(b, m.Consumer.ReceivedLSN)
	b = putLSN(b, m.Consumer.DiskConsistentLSN)
	b = putLSN(b, m.Consumer.RemoteConsistentLSN)
	return putU64(b, uint64(m.Consumer.ReplyTime))
}

func (m *SafeKeeperResponse) Decode(src []byte) error {
	r := newReader(src, TagSafeKeeperResponse, "SafeKeeperResponse")
	m.Term = r.u64()
	m.FlushLSN = r.lsn()
	m.CommitLSN = r.lsn()
	m.HotStandby.TS = r.i64()
	m.HotStandby.Xmin = r.u64()
	m.HotStandby.CatalogXmin = r.u64()
	m.Consumer.TimelineSize = r.u64()
	m.Consumer.ReceivedLSN = r.lsn()
	m.Consumer.DiskConsistentLSN = r.lsn()
	m.Consumer.RemoteConsistentLSN = r.lsn()
	m.Consumer.ReplyTime = r.i64()
	return r.done()
}
