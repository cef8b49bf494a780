package timeline

import (
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// Reader is one replication stream registered on its timeline (AddReader):
// what retention must not remove and the feedback its client sent.
type Reader struct {
	connID uint64
	slot   string // "" when the stream uses no slot
	// For the HTTP API: who reads, since when, as what.
	addr, appName string
	since         time.Time
	termReader    bool
	// start is the LSN the stream started at (START_REPLICATION's).
	start proto.LSN
	// pos is the next LSN the stream sends: WAL from its segment on is kept.
	pos atomic.Uint64

	mu        sync.Mutex
	status    ReaderStatus // last standby status update
	hs        proto.HotStandbyFeedback
	hasHS     bool
	hasCons   bool
	lastReply time.Time // of the last standby status update
	lags      *lagTracker
}

// ReaderConfig describes a replication stream.
type ReaderConfig struct {
	ConnID  uint64 // the connection's number: the "PID" of slot errors
	Slot    string // "" without a slot
	Addr    string
	AppName string // the client's application_name
	// TermReader: the stream reads up to flush_lsn while its term holds
	// (START_REPLICATION (term 'N')).
	TermReader bool
	Start      proto.LSN // where the stream starts
}

// NewReader is a reader of a stream starting now at c.Start.
func NewReader(c ReaderConfig) *Reader {
	rd := &Reader{connID: c.ConnID, slot: c.Slot, addr: c.Addr, appName: c.AppName, since: time.Now(), termReader: c.TermReader,
		start: c.Start, lags: newLagTrackerPtr()}
	rd.pos.Store(uint64(c.Start))
	return rd
}

// ReaderStatus is a standby status update's positions ('r'): written,
// flushed, applied (0: not reported).
type ReaderStatus struct {
	Write, Flush, Apply proto.LSN
}

// Advance records that the stream is about to send up to pos: retention
// keeps WAL from pos's segment on, and the client's reports are clamped
// to it.
func (r *Reader) Advance(pos proto.LSN) { r.pos.Store(uint64(pos)) }

// Sent records that WAL up to end was sent at now (the lag samples).
func (r *Reader) Sent(end proto.LSN, now time.Time) {
	r.mu.Lock()
	r.lags.sent(end, now)
	r.mu.Unlock()
}

// Confirmed is the position the client last confirmed: its flush
// position, or its write position if it reports no flush.
func (r *Reader) Confirmed() proto.LSN {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status.Flush != 0 {
		return r.status.Flush
	}
	return r.status.Write
}

// kind names the reader as the HTTP API reports it; rd.mu held.
func (r *Reader) kind() string {
	switch {
	case r.termReader:
		return "term reader"
	case r.hasCons:
		return "pageserver"
	case r.appName == "pg_receivewal":
		return "pg_receivewal"
	case r.hasHS || r.status.Apply != 0:
		return "standby"
	}
	return "reader"
}

// Position is the next LSN the stream sends.
func (r *Reader) Position() proto.LSN { return proto.LSN(r.pos.Load()) }

// lagBytes is how far the client is behind commit: commit minus the
// highest of the write and flush positions it reported (pg_receivewal
// reports flush 0 without --synchronous). A client that has reported
// nothing yet — no standby status update, or one with both at 0 — is
// counted from the position its stream started at: it asked for WAL from
// there, so it has what lies below, and counting from 0 would report its
// whole LSN as lag. rd.mu held.
func (r *Reader) lagBytes(commit proto.LSN) uint64 {
	at := max(r.status.Write, r.status.Flush)
	if at == 0 {
		at = r.start
	}
	if commit <= at {
		return 0
	}
	return uint64(commit - at)
}

// replState is the replication side of one timeline: its readers, its
// slots and the consumer feedback received since the server started. The
// timeline owner reads the aggregated feedback for every
// SafeKeeperResponse; the retainer reads the horizons.
type replState struct {
	store *storage.Timeline
	tli   uint32 // the timeline's PostgreSQL TLI: every slot's restart_tli
	log   *slog.Logger

	mu       sync.Mutex
	readers  map[*Reader]struct{}
	slots    map[string]*slotState
	consumer proto.ConsumerFeedback // the most advanced consumer's last report
	// remoteConsistent is the highest remote_consistent_lsn any consumer
	// reported since start; consumerSeen tells whether one ever did.
	remoteConsistent proto.LSN
	consumerSeen     bool

	// ret is the registry's retainer and tl the timeline this is part of:
	// kickRetention asks ret for a pass of tl (nil in tests that build a
	// replState alone).
	ret *retainer
	tl  *Timeline

	// tombstones are the dropped slots (slotsync.go), with when they were
	// dropped; slotGen counts the changes of the persistent slots and the
	// tombstones, slotChanged is closed and replaced at each.
	tombstones  map[tombKey]time.Time
	slotGen     uint64
	slotChanged chan struct{}

	maxSlots int      // Config.MaxSlots; 0: no limit
	metrics  *Metrics // nil in tests that build one alone
}

// setSlot and setTombstone put a slot or tombstone in, making the map at
// the first. mu held (or r not yet shared).
func (r *replState) setSlot(s *slotState) {
	if r.slots == nil {
		r.slots = map[string]*slotState{}
	}
	r.slots[s.Name] = s
}

func (r *replState) setTombstone(k tombKey, at time.Time) {
	if r.tombstones == nil {
		r.tombstones = map[tombKey]time.Time{}
	}
	r.tombstones[k] = at
}

// setTLI records a PostgreSQL timeline switch: slots advancing from now
// on restart on tli.
func (r *replState) setTLI(tli uint32) {
	r.mu.Lock()
	r.tli = tli
	r.mu.Unlock()
}

func newReplState(store *storage.Timeline, tli uint32, log *slog.Logger) (*replState, error) {
	// The maps are made when something goes in (setSlot, setTombstone,
	// AddReader): most timelines have no slot and, idle, no reader.
	r := &replState{store: store, tli: tli, log: log}
	slots, err := store.Slots()
	if err != nil {
		return nil, err
	}
	tombs, err := store.SlotTombstones()
	if err != nil {
		return nil, err
	}
	for _, ts := range tombs {
		r.setTombstone(tombKey{ts.Name, ts.Incarnation}, ts.DroppedAt)
	}
	for _, s := range slots {
		saved := s.RestartLSN
		if s.RestartLSN != 0 && s.RestartTLI == 0 {
			// Saved by a build that moved restart_lsn without setting
			// restart_tli; a safekeeper timeline has one TLI. Marked dirty
			// (saved 0) so the next save writes the TLI too.
			s.RestartTLI, saved = tli, 0
		}
		r.setSlot(&slotState{Slot: s, saved: saved})
	}
	return r, nil
}

// kickRetention asks the retainer for a pass; it never blocks.
func (r *replState) kickRetention() {
	if r.ret != nil {
		r.ret.kick(r.tl)
	}
}

// feedback aggregates what the proposer gets in SafeKeeperResponse: over
// the connected readers, min xmin, min catalog_xmin (zero meaning none) and
// max ts of their hot-standby feedback; and the report of the most advanced
// consumer (kept after it disconnects).
func (r *replState) feedback() (proto.HotStandbyFeedback, proto.ConsumerFeedback) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var hs proto.HotStandbyFeedback
	for rd := range r.readers {
		rd.mu.Lock()
		if rd.hasHS {
			hs = mergeHotStandby(hs, rd.hs)
		}
		rd.mu.Unlock()
	}
	return hs, r.consumer
}

// mergeHotStandby folds one reader's feedback in (zero xmins: none).
func mergeHotStandby(agg, h proto.HotStandbyFeedback) proto.HotStandbyFeedback {
	if h.Xmin != 0 && (agg.Xmin == 0 || h.Xmin < agg.Xmin) {
		agg.Xmin = h.Xmin
	}
	if h.CatalogXmin != 0 && (agg.CatalogXmin == 0 || h.CatalogXmin < agg.CatalogXmin) {
		agg.CatalogXmin = h.CatalogXmin
	}
	agg.TS = max(agg.TS, h.TS)
	return agg
}

// AddReader registers a replication stream: from now on retention keeps
// the WAL from its position on, and its feedback counts.
func (t *Timeline) AddReader(rd *Reader) {
	t.repl.mu.Lock()
	if t.repl.readers == nil {
		t.repl.readers = map[*Reader]struct{}{}
	}
	t.repl.readers[rd] = struct{}{}
	t.repl.mu.Unlock()
}

// RemoveReader ends what AddReader began.
func (t *Timeline) RemoveReader(rd *Reader) { t.repl.removeReader(rd) }

func (r *replState) removeReader(rd *Reader) {
	r.mu.Lock()
	delete(r.readers, rd)
	if len(r.readers) == 0 {
		r.readers = nil // Go maps do not shrink: an idle timeline keeps none
	}
	r.mu.Unlock()
	r.kickRetention()
}

// OnStatus records a standby status update (its positions clamped to
// what was sent). A slot follows the client's flush position
// (PostgreSQL's PhysicalConfirmReceivedLocation).
func (t *Timeline) OnStatus(rd *Reader, m ReaderStatus) { t.repl.onStatus(rd, m) }

func (r *replState) onStatus(rd *Reader, m ReaderStatus) {
	now := time.Now()
	rd.mu.Lock()
	rd.status, rd.lastReply = m, now
	if rd.lags != nil {
		rd.lags.reported([3]proto.LSN{m.Write, m.Flush, m.Apply}, rd.Position(), now)
	}
	rd.mu.Unlock()
	if rd.slot == "" || m.Flush == 0 {
		return
	}
	r.mu.Lock()
	s := r.slots[rd.slot]
	var save *storage.Slot
	if s != nil && s.active == rd.connID {
		if lsn := min(m.Flush, rd.Position()); lsn > s.RestartLSN && !s.invalidated {
			s.RestartLSN, s.RestartTLI = lsn, r.tli
			if !s.temporary {
				r.slotsChangedLocked()
			}
			if !s.temporary && time.Since(s.savedAt) >= slotSaveInterval {
				cp := s.Slot
				save = &cp
				s.saved, s.savedAt = lsn, time.Now()
			}
		}
	}
	r.mu.Unlock()
	if save != nil {
		r.saveSlot(*save)
		r.kickRetention()
	}
}

// OnHotStandby records a reader's hot standby feedback ('h'), xmins as
// 64-bit full transaction ids, 0 for none; the proposer gets the minimum
// over the readers.
func (t *Timeline) OnHotStandby(rd *Reader, m proto.HotStandbyFeedback) {
	rd.mu.Lock()
	rd.hs, rd.hasHS = m, true
	rd.mu.Unlock()
}

// OnConsumer records a pageserver-style consumer's feedback ('z'): the
// most advanced goes to the proposer, and its remote_consistent_lsn bounds
// retention.
func (t *Timeline) OnConsumer(rd *Reader, m proto.ConsumerFeedback) { t.repl.onConsumer(rd, m) }

func (r *replState) onConsumer(rd *Reader, m proto.ConsumerFeedback) {
	rd.mu.Lock()
	rd.hasCons = true
	rd.mu.Unlock()
	r.mu.Lock()
	if m.ReceivedLSN >= r.consumer.ReceivedLSN {
		r.consumer = m
	}
	r.remoteConsistent = max(r.remoteConsistent, m.RemoteConsistentLSN)
	r.consumerSeen = true
	r.mu.Unlock()
	r.kickRetention()
}

// retentionInputs snapshots what the horizon depends on.
func (r *replState) retentionInputs(in *retentionInputs) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.slots {
		if s.RestartLSN != 0 {
			in.Slots = append(in.Slots, slotPos{Name: s.Name, RestartLSN: s.RestartLSN})
		}
	}
	for rd := range r.readers {
		in.ReaderPos = append(in.ReaderPos, rd.Position())
	}
	in.ConsumerSeen = r.consumerSeen
	in.RemoteConsistent = r.remoteConsistent
}

// ReaderInfo is a replication stream as the HTTP API shows it.
type ReaderInfo struct {
	Kind                string // term reader, pageserver, pg_receivewal, standby or reader
	Addr, AppName, Slot string
	Since               time.Time
	Sent                proto.LSN // the next LSN the stream sends
	Write, Flush, Apply proto.LSN // as the client last reported them
	LagBytes            uint64    // commit_lsn minus the higher of write and flush
	WriteLag, FlushLag  *float64  // seconds, as pg_stat_replication's; nil: none
	ReplayLag           *float64
	LastReply           time.Time // zero: no standby status update yet
}

// SlotInfo is a replication slot as the HTTP API shows it.
type SlotInfo struct {
	Name              string
	Temporary, Active bool
	RestartLSN        proto.LSN
}

// Replication is the replication side of a timeline at one moment:
// readers (oldest first) and slots (by name).
type Replication struct {
	// RemoteConsistentLSN is the highest remote_consistent_lsn a
	// consumer reported since the server started.
	RemoteConsistentLSN proto.LSN
	Readers             []ReaderInfo
	Slots               []SlotInfo
}

// Replication returns the readers and slots, lags counted against
// commit.
func (t *Timeline) Replication(commit proto.LSN) Replication {
	r := t.repl
	r.mu.Lock()
	out := Replication{RemoteConsistentLSN: r.remoteConsistent, Readers: make([]ReaderInfo, 0, len(r.readers)), Slots: make([]SlotInfo, 0, len(r.slots))}
	for rd := range r.readers {
		rd.mu.Lock()
		out.Readers = append(out.Readers, ReaderInfo{Kind: rd.kind(), Addr: rd.addr, AppName: rd.appName, Slot: rd.slot, Since: rd.since,
			Sent: rd.Position(), Write: rd.status.Write, Flush: rd.status.Flush, Apply: rd.status.Apply, LagBytes: rd.lagBytes(commit),
			WriteLag: rd.lags.seconds(0), FlushLag: rd.lags.seconds(1), ReplayLag: rd.lags.seconds(2), LastReply: rd.lastReply})
		rd.mu.Unlock()
	}
	for _, s := range r.slots {
		out.Slots = append(out.Slots, SlotInfo{Name: s.Name, Temporary: s.temporary, Active: s.active != 0, RestartLSN: s.RestartLSN})
	}
	r.mu.Unlock()
	sort.Slice(out.Readers, func(i, j int) bool { return out.Readers[i].Since.Before(out.Readers[j].Since) })
	sort.Slice(out.Slots, func(i, j int) bool { return out.Slots[i].Name < out.Slots[j].Name })
	return out
}

// ReplicationSummary is what /metrics shows of the replication side: the
// highest remote_consistent_lsn reported, the readers, and the lag of the
// one furthest behind commit.
func (t *Timeline) ReplicationSummary(commit proto.LSN) (remoteConsistent proto.LSN, readers int, maxLag uint64) {
	r := t.repl
	r.mu.Lock()
	defer r.mu.Unlock()
	for rd := range r.readers {
		rd.mu.Lock()
		maxLag = max(maxLag, rd.lagBytes(commit))
		rd.mu.Unlock()
	}
	return r.remoteConsistent, len(r.readers), maxLag
}

// Counts is how many replication streams and slots the timeline has.
func (t *Timeline) Counts() (readers, slots int) {
	t.repl.mu.Lock()
	defer t.repl.mu.Unlock()
	return len(t.repl.readers), len(t.repl.slots)
}
