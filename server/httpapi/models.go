package httpapi

import (
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// The JSON bodies of the API, one Go type each, used by the handlers that
// write them, by the Client that reads them (the CLI's status, timeline
// list|show|delete, wal dump --http) and, for a timeline's stored state, by
// `safekeeper inspect`. LSNs are "X/X" (proto.LSN's text form), times RFC
// 3339. A field's place in its struct is its place in the JSON.

// Status is GET /v1/status.
type Status struct {
	ID             uint64  `json:"id"`
	Version        string  `json:"version"`
	UptimeSeconds  float64 `json:"uptime_seconds"`
	DataDir        string  `json:"data_dir"`
	ListenPG       string  `json:"listen_pg"`
	ListenHTTP     string  `json:"listen_http"`
	Timelines      int     `json:"timelines"`
	DiskUsageBytes int64   `json:"disk_usage_bytes"`
	DiskFreeBytes  uint64  `json:"disk_free_bytes"`
	// WALRefused is the disk circuit breaker while it refuses new WAL
	// (53100, /readyz 503); null while WAL is taken.
	WALRefused *WALRefused `json:"wal_refused"`
}

// WALRefused is why the disk circuit breaker refuses new WAL.
type WALRefused struct {
	// Reason is RefusedMinFreeDisk or RefusedMaxDiskUsage.
	Reason string `json:"reason"`
	// Detail is the reading in words, with the numbers: the 53100
	// message proposers get.
	Detail string `json:"detail"`
	// Since is when the breaker tripped (RFC 3339, UTC).
	Since time.Time `json:"since"`
}

// The disk circuit breaker's reasons (WALRefused.Reason).
const (
	// RefusedMinFreeDisk: the file system's free space, with the free
	// pages inside the database file, is below --min-free-disk or its
	// auto reserve.
	RefusedMinFreeDisk = "min_free_disk"
	// RefusedMaxDiskUsage: the database file's pages in use reached
	// --max-disk-usage.
	RefusedMaxDiskUsage = "max_disk_usage"
)

// TimelineSummary is one element of GET /v1/tenant/timeline.
type TimelineSummary struct {
	TenantID    string    `json:"tenant_id"`
	TimelineID  string    `json:"timeline_id"`
	Term        uint64    `json:"term"`
	PgTimeline  uint32    `json:"pg_timeline"`
	FlushLSN    proto.LSN `json:"flush_lsn"`
	CommitLSN   proto.LSN `json:"commit_lsn"`
	RemovedUpTo proto.LSN `json:"removed_up_to"`
}

// TermSwitch is one entry of a term history: the term and the LSN its
// WAL starts at.
type TermSwitch struct {
	Term     uint64    `json:"term"`
	StartLSN proto.LSN `json:"start_lsn"`
}

// TimelineState is a timeline's durable state as both the API
// (Timeline) and `safekeeper inspect` (StoredTimeline) show it: their
// first fields.
type TimelineState struct {
	TenantID         string       `json:"tenant_id"`
	TimelineID       string       `json:"timeline_id"`
	Term             uint64       `json:"term"`
	VotedFor         string       `json:"voted_for"`
	LastLogTerm      uint64       `json:"last_log_term"`
	TermHistory      []TermSwitch `json:"term_history"`
	TimelineStartLSN proto.LSN    `json:"timeline_start_lsn"`
	FlushLSN         proto.LSN    `json:"flush_lsn"`
	CommitLSN        proto.LSN    `json:"commit_lsn"`
	TruncateLSN      proto.LSN    `json:"truncate_lsn"`
	RemovedUpTo      proto.LSN    `json:"removed_up_to"`
	WALStartLSN      proto.LSN    `json:"wal_start_lsn"` // the first byte stored
}

// Timeline is GET /v1/tenant/{tenant_id}/timeline/{timeline_id}.
type Timeline struct {
	TimelineState
	WALBytes            uint64    `json:"wal_bytes"` // stored: flush_lsn - wal_start_lsn
	RemoteConsistentLSN proto.LSN `json:"remote_consistent_lsn"`
	RetentionHorizon    proto.LSN `json:"retention_horizon"`
	RetentionReason     string    `json:"retention_reason"`
	// BackupLSN: the timeline's WAL is in the archive up to here (0/0:
	// nothing yet, or no archive); BackupLagBytes is commit_lsn minus it
	// and BackupLagSeconds how long the archive has been behind commit_lsn
	// (absent without an archive).
	BackupLSN proto.LSN `json:"backup_lsn"`
	// Configuration is the timeline's membership (README_PROTO.md,
	// "Membership and generations"); absent in generation 0 (none).
	Configuration    *proto.Configuration `json:"configuration,omitempty"`
	BackupLagBytes   *uint64              `json:"backup_lag_bytes,omitempty"`
	BackupLagSeconds *float64             `json:"backup_lag_seconds,omitempty"`
	PgVersion        uint32               `json:"pg_version"`
	PgTimeline       uint32               `json:"pg_timeline"`
	SystemID         uint64               `json:"system_id,string"`
	WalSegSize       uint32               `json:"wal_seg_size"`
	Proposer         *Proposer            `json:"proposer"`
	Readers          []Reader             `json:"readers"`
	Slots            []Slot               `json:"slots"`
}

// Proposer is the proposer streaming to a timeline.
type Proposer struct {
	Address string    `json:"address"`
	Term    uint64    `json:"term"`
	Since   time.Time `json:"since"`
	// WriteLSN is the end of the WAL it sent, CommitLSN the commit_lsn it
	// last sent: what it reports to its primary as write_lsn and
	// flush_lsn (pg_stat_replication there).
	WriteLSN    proto.LSN `json:"write_lsn"`
	CommitLSN   proto.LSN `json:"commit_lsn"`
	LastPushAge float64   `json:"last_push_age_seconds"`
}

// Reader is one replication stream of a timeline.
type Reader struct {
	Kind            string    `json:"kind"`
	Address         string    `json:"address"`
	ApplicationName string    `json:"application_name"`
	Slot            string    `json:"slot,omitempty"`
	Since           time.Time `json:"since"`
	SentLSN         proto.LSN `json:"sent_lsn"`
	WriteLSN        proto.LSN `json:"write_lsn"`
	FlushLSN        proto.LSN `json:"flush_lsn"`
	ApplyLSN        proto.LSN `json:"apply_lsn"`
	LagBytes        uint64    `json:"lag_bytes"`
	// The lags in time as pg_stat_replication's write_lag, flush_lag and
	// replay_lag; null when not measured or cleared.
	WriteLag  *float64   `json:"write_lag_seconds"`
	FlushLag  *float64   `json:"flush_lag_seconds"`
	ReplayLag *float64   `json:"replay_lag_seconds"`
	LastReply *time.Time `json:"last_reply,omitempty"`
}

// Slot is one replication slot of a timeline.
type Slot struct {
	Name       string    `json:"slot_name"`
	Temporary  bool      `json:"temporary"`
	Active     bool      `json:"active"`
	RestartLSN proto.LSN `json:"restart_lsn"`
}

// MembershipSwitch is the answer to PUT .../membership (Neon's
// ConfigurationSwitchResponse): the configuration the safekeeper holds
// after the call, whether the call switched it, and the positions a
// membership change waits on.
type MembershipSwitch struct {
	Configuration proto.Configuration `json:"configuration"`
	Switched      bool                `json:"switched"`
	Term          uint64              `json:"term"`
	LastLogTerm   uint64              `json:"last_log_term"`
	FlushLSN      proto.LSN           `json:"flush_lsn"`
	CommitLSN     proto.LSN           `json:"commit_lsn"`
}

// TermBumpRequest is the body of POST .../term_bump, TermBumpResponse its
// answer (Neon's names).
type TermBumpRequest struct {
	Term uint64 `json:"term"`
}

type TermBumpResponse struct {
	PreviousTerm uint64 `json:"previous_term"`
	CurrentTerm  uint64 `json:"current_term"`
}

// PullRequest is the body of POST /v1/pull_timeline: the timeline and the
// peer to copy it from (its PostgreSQL-protocol address, host:port).
type PullRequest struct {
	TenantID   string `json:"tenant_id"`
	TimelineID string `json:"timeline_id"`
	From       string `json:"from"`
}

// PullResponse is what a pull copied; Existed: the timeline was held
// already, nothing was copied.
type PullResponse struct {
	Existed     bool      `json:"existed"`
	WALStartLSN proto.LSN `json:"wal_start_lsn"`
	FlushLSN    proto.LSN `json:"flush_lsn"`
	Term        uint64    `json:"term"`
	CommitLSN   proto.LSN `json:"commit_lsn"`
}

// DeleteResult is what DELETE of a timeline found, in Neon's names;
// DELETE of a tenant answers one per timeline id.
type DeleteResult struct {
	// DirExisted: the timeline was stored.
	DirExisted bool `json:"dir_existed"`
	// WasActive: connections were ended (force).
	WasActive bool `json:"was_active"`
	// ArchiveObjectsDeleted: with ?archive=true, the objects of the
	// timeline's archive deleted (absent without it: the archive stays).
	ArchiveObjectsDeleted *int `json:"archive_objects_deleted,omitempty"`
}

// ErrorBody is every error answer: the message and a machine-readable
// code (not_found, busy, bad_id, ...).
type ErrorBody struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// Inspection is `safekeeper inspect --json`: what a stopped
// safekeeper's data directory holds.
type Inspection struct {
	DataDir   string           `json:"data_dir"`
	NodeID    *uint64          `json:"node_id"`
	FileBytes int64            `json:"file_bytes"`
	Timelines []StoredTimeline `json:"timelines"`
}

// StoredTimeline is one timeline of an Inspection: its durable state, the
// WAL it holds, its persistent slots.
type StoredTimeline struct {
	TimelineState
	WALEndLSN  proto.LSN    `json:"wal_end_lsn"`
	WALBytes   uint64       `json:"wal_bytes"`
	PgVersion  uint32       `json:"pg_version"`
	PgTimeline uint32       `json:"pg_timeline"`
	PgHistory  string       `json:"pg_history,omitempty"`
	SystemID   uint64       `json:"system_id,string"`
	WalSegSize uint32       `json:"wal_seg_size"`
	Slots      []StoredSlot `json:"slots"`
}

// StoredSlot is a persistent replication slot as stored.
type StoredSlot struct {
	Name       string    `json:"slot_name"`
	RestartLSN proto.LSN `json:"restart_lsn"`
	RestartTLI uint32    `json:"restart_tli"`
}

// NewInspection is in, read from the data directory dir whose database
// file is fileBytes long, as `safekeeper inspect --json` prints it.
func NewInspection(dir string, fileBytes int64, in *timeline.Inspection) *Inspection {
	out := &Inspection{DataDir: dir, NodeID: in.NodeID, FileBytes: fileBytes, Timelines: []StoredTimeline{}}
	for _, t := range in.Timelines {
		st := t.State
		j := StoredTimeline{
			TimelineState: TimelineState{
				TenantID: st.TenantID.String(), TimelineID: st.TimelineID.String(), Term: st.VotedFor.Term, VotedFor: st.VotedFor.String(),
				LastLogTerm: st.LastLogTerm(), TermHistory: termHistory(st.History), TimelineStartLSN: st.TimelineStartLSN,
				FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN, TruncateLSN: st.TruncateLSN, RemovedUpTo: t.RemovedUpTo,
			},
			WALEndLSN: t.WALEndLSN, PgVersion: st.PgVersion, PgTimeline: st.PgTimeline, PgHistory: string(st.PgHistory), SystemID: st.SystemID,
			WalSegSize: st.WalSegSize, Slots: []StoredSlot{},
		}
		if st.TimelineStartLSN != 0 {
			j.WALStartLSN = max(j.RemovedUpTo, st.TimelineStartLSN)
			if j.WALEndLSN > j.WALStartLSN {
				j.WALBytes = uint64(j.WALEndLSN - j.WALStartLSN)
			}
		}
		for _, s := range t.Slots {
			j.Slots = append(j.Slots, StoredSlot{Name: s.Name, RestartLSN: s.RestartLSN, RestartTLI: s.RestartTLI})
		}
		out.Timelines = append(out.Timelines, j)
	}
	return out
}

// termHistory is h in the API's form (an empty list, not null, when h is
// empty).
func termHistory(h proto.TermHistory) []TermSwitch {
	out := []TermSwitch{}
	for _, e := range h {
		out = append(out, TermSwitch{Term: e.Term, StartLSN: e.StartLSN})
	}
	return out
}
