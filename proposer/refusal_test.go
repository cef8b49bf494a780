package proposer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// serveTimelineStatus answers one TIMELINE_STATUS query with the timeline
// of the given description, as a safekeeper does (server/commands.go).
func serveTimelineStatus(be *pgproto3.Backend, systemID uint64, pgTimeline uint32) {
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if be.Flush() != nil {
		return
	}
	if m, err := be.Receive(); err != nil {
		return
	} else if q, ok := m.(*pgproto3.Query); !ok || q.String != "TIMELINE_STATUS" {
		return
	}
	cols := []struct{ name, value string }{
		{"system_id", fmt.Sprint(systemID)}, {"pg_version", "150004"}, {"wal_seg_size", "16777216"},
		{"pg_timeline", fmt.Sprint(pgTimeline)}, {"term", "4"}, {"last_log_term", "4"},
		{"flush_lsn", "0/3000000"}, {"commit_lsn", "0/3000000"}, {"timeline_start_lsn", "0/1000000"}, {"removed_up_to", "0/0"},
	}
	var desc pgproto3.RowDescription
	var row pgproto3.DataRow
	for _, c := range cols {
		desc.Fields = append(desc.Fields, pgproto3.FieldDescription{Name: []byte(c.name), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
		row.Values = append(row.Values, []byte(c.value))
	}
	be.Send(&desc)
	be.Send(&row)
	be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	be.Flush()
}

// TestRefusalForGoodIsClassifiedAndFinal: a safekeeper's 22023 — at the
// greeting, or after it, on the TimelineHistory — stops the link (no
// reconnect), and the refusal the owner gets is a *RefusalError whose
// Reason comes from the safekeeper's TIMELINE_STATUS compared with the
// ServerInfo sent, not from its message: a newer pg_timeline there is an
// older PostgreSQL timeline here (a primary a standby was promoted from);
// a matching ServerInfo whose TimelineHistory was refused is a forked
// timeline.
func TestRefusalForGoodIsClassifiedAndFinal(t *testing.T) {
	const sysID = 7000000000000000001
	si := &proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150004, SystemID: sysID, TenantID: proto.ID{1}, TimelineID: proto.ID{2},
		PgTimeline: 2, WalSegSize: 16 << 20}
	hist := &proto.TimelineHistory{PgTimeline: 2, Content: []byte("1\t0/3000000\tno recovery target specified\n")}
	for _, tc := range []struct {
		name       string
		afterGreet bool   // the refusal comes after the greeting, on the TimelineHistory
		theirTLI   uint32 // the safekeeper's timeline's pg_timeline
		want       RefusalReason
	}{
		{"older PostgreSQL timeline, at the greeting", false, 3, RefusedOlderPgTimeline},
		{"forked history, after the greeting", true, 2, RefusedForkedPgTimeline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pushes atomic.Int32
			addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
				if n%2 == 0 { // every refusal is followed by the link's TIMELINE_STATUS
					serveTimelineStatus(be, sysID, tc.theirTLI)
					return
				}
				pushes.Add(1)
				if tc.afterGreet {
					if !greet(be) {
						return
					}
					if m, err := be.Receive(); err != nil {
						return
					} else if cd, ok := m.(*pgproto3.CopyData); !ok || len(cd.Data) == 0 || cd.Data[0] != proto.TagTimelineHistory {
						t.Errorf("after the greeting: %T, want the TimelineHistory", m)
						return
					}
				} else {
					be.Send(&pgproto3.AuthenticationOk{})
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
					be.Flush()
					be.Receive() // START_WAL_PUSH
					be.Send(&pgproto3.CopyBothResponse{})
					be.Flush()
					be.Receive() // the ServerInfo
				}
				refuse(be, "22023")
			})
			l := &skLinks{
				addrs: []string{addr}, si: si, hist: hist, queueCap: 16, bo: backoff{min: 10 * time.Millisecond, max: 50 * time.Millisecond},
				log: slog.New(slog.NewTextHandler(io.Discard, nil)), events: make(chan skEvent, 16),
				dial: client.DialConfig{TenantID: si.TenantID, TimelineID: si.TimelineID, ConnectTimeout: 5 * time.Second},
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l.start(ctx)
			linkDone := make(chan struct{})
			go func() { l.wg.Wait(); close(linkDone) }()
			var refusal skEvent
			outs := map[int]chan []byte{}
			deadline := time.After(10 * time.Second)
			for !refusal.refused {
				select {
				case ev := <-l.events:
					switch {
					case ev.refused:
						refusal = ev
					case ev.out != nil:
						outs[ev.gen] = ev.out
					case ev.err != nil && outs[ev.gen] != nil: // the owner is done with the connection
						close(outs[ev.gen])
						delete(outs, ev.gen)
					}
				case <-deadline:
					t.Fatal("no refusal event within 10s")
				}
			}
			select {
			case <-linkDone:
			case <-time.After(5 * time.Second):
				t.Fatal("the link goes on after a refusal for good")
			}
			var re *RefusalError
			var pe *pgconn.PgError
			if !errors.As(refusal.err, &re) || re.Reason != tc.want || re.Safekeeper != addr || re.PgTimeline != tc.theirTLI ||
				!errors.As(refusal.err, &pe) || pe.Code != "22023" {
				t.Fatalf("refusal %#v (%v); want a *RefusalError of %s, %s, pg_timeline %d, wrapping the 22023", refusal.err, refusal.err, addr, tc.want, tc.theirTLI)
			}
			if n := pushes.Load(); n != 1 {
				t.Fatalf("%d push connections, want 1: a refusal for good is not retried", n)
			}
			err := incompatibleError(map[int]error{0: refusal.err}, []string{addr}, si)
			var ie *IncompatibleError
			if !errors.Is(err, ErrIncompatible) || !errors.As(err, &ie) || ie.Reason != tc.want || !strings.HasPrefix(err.Error(), "proposer: refused: "+tc.want.String()) {
				t.Fatalf("IncompatibleError %v; want errors.Is ErrIncompatible, reason %s", err, tc.want)
			}
			if tc.want == RefusedOlderPgTimeline && !strings.Contains(err.Error(), "the safekeepers' timeline is on PostgreSQL timeline 3, this primary on 2") {
				t.Fatalf("IncompatibleError %q does not name both PostgreSQL timelines", err)
			}
		})
	}
}

// TestRefusedByProbesNeedsNoQuorum: the timelines the safekeepers report
// (TIMELINE_STATUS) foresee a refusal for good only when so many of them
// would refuse that no quorum is left, and name the most common reason.
func TestRefusedByProbesNeedsNoQuorum(t *testing.T) {
	si := &proto.ServerInfo{PgVersion: 150004, SystemID: 5, PgTimeline: 1, WalSegSize: 16 << 20}
	same := client.Probe{Holds: true, SystemID: 5, PgVersion: 150002, SegSize: 16 << 20, PgTimeline: 1}
	promoted := same
	promoted.PgTimeline = 2
	other := same
	other.SystemID = 6
	missing := client.Probe{Missing: true}
	probes := func(ps ...client.Probe) []client.Probe {
		for i := range ps {
			ps[i].Addr = fmt.Sprintf("sk%d:5454", i+1)
		}
		return ps
	}
	if err := refusedByProbes(probes(promoted, same, same), si); err != nil {
		t.Fatalf("one of three on a newer PostgreSQL timeline: %v, want none (a quorum is left)", err)
	}
	if err := refusedByProbes(probes(same, missing, missing), si); err != nil {
		t.Fatalf("a matching timeline and two missing: %v, want none", err)
	}
	err := refusedByProbes(probes(promoted, promoted, other), si)
	var ie *IncompatibleError
	if !errors.As(err, &ie) || ie.Reason != RefusedOlderPgTimeline || len(ie.Refusals) != 3 || ie.Theirs != 2 || ie.Ours != 1 ||
		ie.Refusals[2].Reason != RefusedSystemID {
		t.Fatalf("two on a newer PostgreSQL timeline, one of another cluster: %v; want an older PostgreSQL timeline, each safekeeper's reason", err)
	}
}
