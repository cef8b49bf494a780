package server

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/storage"
)

// walReader is one replication stream registered on its timeline: what
// retention must not remove and the feedback its client sent.
type walReader struct {
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
	status    pgwire.StandbyStatusUpdate // last 'r'
	hs        pgwire.HotStandbyFeedback  // last 'h'
	hasHS     bool
	consumer  pgwire.ConsumerFeedback // last 'z'
	hasCons   bool
	lastReply time.Time // of the last 'r'
	lags      *lagTracker
}

// kind names the reader as the HTTP API reports it; rd.mu held.
func (r *walReader) kind() string {
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

func (r *walReader) position() proto.LSN { return proto.LSN(r.pos.Load()) }

// lagBytes is how far the client is behind commit: commit minus the
// highest of the write and flush positions it reported (pg_receivewal
// reports flush 0 without --synchronous). A client that has reported
// nothing yet — no standby status update, or one with both at 0 — is
// counted from the position its stream started at: it asked for WAL from
// there, so it has what lies below, and counting from 0 would report its
// whole LSN as lag. rd.mu held.
func (r *walReader) lagBytes(commit proto.LSN) uint64 {
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
// SafeKeeperResponse; the retention goroutine reads the horizons.
type replState struct {
	store *storage.Timeline
	tli   uint32 // the timeline's PostgreSQL TLI: every slot's restart_tli
	log   *slog.Logger

	mu       sync.Mutex
	readers  map[*walReader]struct{}
	slots    map[string]*slotState
	consumer proto.ConsumerFeedback // the most advanced consumer's last report
	// remoteConsistent is the highest remote_consistent_lsn any consumer
	// reported since start; consumerSeen tells whether one ever did.
	remoteConsistent proto.LSN
	consumerSeen     bool

	kick chan struct{} // wakes the retention goroutine; capacity 1

	// tombstones are the dropped slots (slotsync.go), with when they were
	// dropped; slotGen counts the changes of the persistent slots and the
	// tombstones, slotChanged is closed and replaced at each.
	tombstones  map[tombKey]time.Time
	slotGen     uint64
	slotChanged chan struct{}

	maxSlots int                    // Config.MaxSlots; 0: no limit
	refused  *prometheus.CounterVec // nil in tests that build one alone
}

// setTLI records a PostgreSQL timeline switch: slots advancing from now
// on restart on tli.
func (r *replState) setTLI(tli uint32) {
	r.mu.Lock()
	r.tli = tli
	r.mu.Unlock()
}

func newReplState(store *storage.Timeline, tli uint32, log *slog.Logger) (*replState, error) {
	r := &replState{store: store, tli: tli, log: log, readers: map[*walReader]struct{}{}, slots: map[string]*slotState{}, kick: make(chan struct{}, 1),
		tombstones: map[tombKey]time.Time{}}
	slots, err := store.Slots()
	if err != nil {
		return nil, err
	}
	tombs, err := store.SlotTombstones()
	if err != nil {
		return nil, err
	}
	for _, ts := range tombs {
		r.tombstones[tombKey{ts.Name, ts.Incarnation}] = ts.DroppedAt
	}
	for _, s := range slots {
		saved := s.RestartLSN
		if s.RestartLSN != 0 && s.RestartTLI == 0 {
			// Saved by a build that moved restart_lsn without setting
			// restart_tli; a safekeeper timeline has one TLI. Marked dirty
			// (saved 0) so the next save writes the TLI too.
			s.RestartTLI, saved = tli, 0
		}
		r.slots[s.Name] = &slotState{Slot: s, saved: saved}
	}
	return r, nil
}

// kickRetention asks the retention goroutine for a pass; it never blocks.
func (r *replState) kickRetention() {
	select {
	case r.kick <- struct{}{}:
	default:
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

func mergeHotStandby(agg proto.HotStandbyFeedback, h pgwire.HotStandbyFeedback) proto.HotStandbyFeedback {
	if x := h.FullXmin(); h.Xmin != 0 && (agg.Xmin == 0 || x < agg.Xmin) {
		agg.Xmin = x
	}
	if x := h.FullCatalogXmin(); h.CatalogXmin != 0 && (agg.CatalogXmin == 0 || x < agg.CatalogXmin) {
		agg.CatalogXmin = x
	}
	agg.TS = max(agg.TS, h.SendTime)
	return agg
}

func (r *replState) addReader(rd *walReader) {
	r.mu.Lock()
	r.readers[rd] = struct{}{}
	r.mu.Unlock()
}

func (r *replState) removeReader(rd *walReader) {
	r.mu.Lock()
	delete(r.readers, rd)
	r.mu.Unlock()
	r.kickRetention()
}

// onStatus records a standby status update. A slot follows the client's
// flush position (PostgreSQL's PhysicalConfirmReceivedLocation), never past
// what was sent.
func (r *replState) onStatus(rd *walReader, m pgwire.StandbyStatusUpdate) {
	now := time.Now()
	rd.mu.Lock()
	rd.status, rd.lastReply = m, now
	if rd.lags != nil {
		rd.lags.reported([3]proto.LSN{m.Write, m.Flush, m.Apply}, rd.position(), now)
	}
	rd.mu.Unlock()
	if rd.slot == "" || m.Flush == 0 {
		return
	}
	r.mu.Lock()
	s := r.slots[rd.slot]
	var save *storage.Slot
	if s != nil && s.active == rd.connID {
		if lsn := min(m.Flush, rd.position()); lsn > s.RestartLSN && !s.invalidated {
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

func (r *replState) onHotStandby(rd *walReader, m pgwire.HotStandbyFeedback) {
	rd.mu.Lock()
	rd.hs, rd.hasHS = m, true
	rd.mu.Unlock()
}

func (r *replState) onConsumer(rd *walReader, m pgwire.ConsumerFeedback) {
	rd.mu.Lock()
	rd.consumer, rd.hasCons = m, true
	rd.mu.Unlock()
	r.mu.Lock()
	if m.ReceivedLSN >= r.consumer.ReceivedLSN {
		r.consumer = proto.ConsumerFeedback{
			TimelineSize: m.TimelineSize, ReceivedLSN: m.ReceivedLSN, DiskConsistentLSN: m.DiskConsistentLSN,
			RemoteConsistentLSN: m.RemoteConsistentLSN, ReplyTime: m.ReplyTime,
		}
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
		in.ReaderPos = append(in.ReaderPos, rd.position())
	}
	in.ConsumerSeen = r.consumerSeen
	in.RemoteConsistent = r.remoteConsistent
}

// parseFeedback decodes one CopyData from a reader.
func parseFeedback(payload []byte) (any, error) {
	if len(payload) == 0 {
		return nil, pgwire.Errorf(pgwire.ProtocolViolation, "invalid standby message: empty CopyData")
	}
	switch payload[0] {
	case pgwire.TagStandbyStatusUpdate:
		return pgwire.ParseStandbyStatusUpdate(payload)
	case pgwire.TagHotStandbyFeedback:
		return pgwire.ParseHotStandbyFeedback(payload)
	case pgwire.TagConsumerFeedback:
		return pgwire.ParseConsumerFeedback(payload)
	}
	return nil, pgwire.Errorf(pgwire.ProtocolViolation, "unexpected message type %q", fmt.Sprintf("%c", payload[0]))
}
