package server

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
	"github.com/safekeeper/safekeeper/storage"
)

func wireOf(t *testing.T, err error) *pgwire.Error {
	t.Helper()
	var pe *pgwire.Error
	if !errors.As(wireError(err), &pe) {
		t.Fatalf("wireError(%v) is not a *pgwire.Error", err)
	}
	return pe
}

// TestWireErrorOfGrammar: a query the command grammar refuses is 42601 or
// 0A000 by its kind, with the grammar's message as it is.
func TestWireErrorOfGrammar(t *testing.T) {
	cases := []struct{ q, code, msg string }{
		{"START_REPLICATION", pgwire.SyntaxError, "syntax error: unexpected end of command"},
		{"TIMELINE_HISTORY 0", pgwire.SyntaxError, "invalid timeline 0"},
		{"BASE_BACKUP", pgwire.FeatureNotSupported, "BASE_BACKUP is not supported by a safekeeper: take base backups from the primary"},
		{"START_REPLICATION SLOT s LOGICAL 0/0", pgwire.FeatureNotSupported, "logical replication is not supported by a safekeeper"},
	}
	for _, c := range cases {
		_, err := replcmd.Parse(c.q)
		if err == nil {
			t.Fatalf("%q parsed", c.q)
		}
		if pe := wireOf(t, err); pe.Code != c.code || pe.Message != c.msg || pe.Hint != "" || pe.Detail != "" {
			t.Errorf("%q: %s %q, want %s %q", c.q, pe.Code, pe.Message, c.code, c.msg)
		}
	}
}

// TestWireErrorOfSlotName: a name PostgreSQL's ReplicationSlotValidateName
// refuses is 42602 with its message, and its hint for a bad character.
func TestWireErrorOfSlotName(t *testing.T) {
	const hint = "Replication slot names may only contain lower case letters, numbers, and the underscore character."
	long := strings.Repeat("s", proto.MaxSlotNameLen+1)
	cases := []struct{ name, msg, hint string }{
		{"", `replication slot name "" is too short`, ""},
		{long, `replication slot name "` + long + `" is too long`, ""},
		{"Bad-Name", `replication slot name "Bad-Name" contains invalid character`, hint},
	}
	for _, c := range cases {
		if pe := wireOf(t, proto.CheckSlotName(c.name)); pe.Code != pgwire.InvalidName || pe.Message != c.msg || pe.Hint != c.hint {
			t.Errorf("%q: %s %q hint %q, want %s %q hint %q", c.name, pe.Code, pe.Message, pe.Hint, pgwire.InvalidName, c.msg, c.hint)
		}
	}

	// And so over the wire, for CREATE_REPLICATION_SLOT; the connection
	// goes on.
	s := startTestServer(t, t.TempDir(), nil)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(1, 100, 0)
	conn := replConnect(t, s.Addr().String(), false, "")
	for _, c := range cases[1:] { // "" is a grammar error: a zero-length delimited identifier
		_, err := exec(t, conn, `CREATE_REPLICATION_SLOT "`+c.name+`" PHYSICAL`)
		if pe := wantCode(t, err, pgwire.InvalidName); pe.Message != c.msg || pe.Hint != c.hint {
			t.Errorf("CREATE_REPLICATION_SLOT %q: %q hint %q, want %q hint %q", c.name, pe.Message, pe.Hint, c.msg, c.hint)
		}
	}
	_, err := exec(t, conn, "START_REPLICATION")
	if pe := wantCode(t, err, pgwire.SyntaxError); pe.Message != "syntax error: unexpected end of command" {
		t.Errorf("START_REPLICATION alone: %q", pe.Message)
	}
	if row := oneRow(t, must(exec(t, conn, "READ_REPLICATION_SLOT bad_name")), nil, "slot_type", "restart_lsn", "restart_tli"); strings.Join(row, ",") != "NULL,NULL,NULL" {
		t.Fatalf("a refused slot exists: %q", row)
	}
}

// TestWireErrorOfAcceptor: the acceptor's refusals get the SQLSTATEs
// README_PROTO.md lists (written out here: they are the wire contract), with
// the error's text as the message.
func TestWireErrorOfAcceptor(t *testing.T) {
	cases := []struct {
		err  error
		code string
	}{
		{acceptor.ErrProtocol, "08P01"},
		{acceptor.ErrVoteRefused, "55P03"},
		{acceptor.ErrStaleTerm, "40001"},
		{acceptor.ErrCommonPointMismatch, "22000"},
		{acceptor.ErrTruncateCommitted, "55000"},
		{acceptor.ErrIncompatible, "22023"},
		{acceptor.ErrStorage, "58030"},
		{fmt.Errorf("%w: %w", acceptor.ErrStorage, syscall.ENOSPC), "53100"},
		{errors.New("something else"), "XX000"},
	}
	for _, c := range cases {
		err := fmt.Errorf("%w: details", c.err)
		if pe := wireOf(t, err); pe.Code != c.code || pe.Message != err.Error() {
			t.Errorf("%v: %s %q, want %s", c.err, pe.Code, pe.Message, c.code)
		}
	}
}

// TestCreateTimelineOnFullDiskIs53100: a greeting that creates a timeline
// on a full disk is refused with 53100 (disk_full), as PostgreSQL reports
// ENOSPC: the cause survives every wrapping between storage and the wire
// (it was 58030 when the server wrapped it with %v).
func TestCreateTimelineOnFullDiskIs53100(t *testing.T) {
	s := startHookedServer(t, t.TempDir(), nil, hooks{create: func(acceptor.State) (*storage.Timeline, error) {
		// What bbolt returns when the file cannot grow.
		return nil, fmt.Errorf("storage: create timeline: %w", &os.PathError{Op: "write", Path: "safekeeper.db", Err: syscall.ENOSPC})
	}})
	q, err := proposer.Dial(testCtx(t), proposer.DialConfig{AllowTimelineCreation: true, Addr: s.Addr().String(), TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xdd}}); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := q.Recv(testCtx(t)); !errors.As(err, &pe) || pe.Code != pgwire.DiskFull {
		t.Fatalf("creating a timeline on a full disk: %v, want SQLSTATE %s", err, pgwire.DiskFull)
	}
}
