package harness

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// StatusRow runs TIMELINE_STATUS on c, a replication connection to a
// safekeeper that names a timeline, and returns its one row by column
// name (flush_lsn, commit_lsn, term, ...). Anything else fails the test.
func StatusRow(t testing.TB, c *pgconn.PgConn) map[string]string {
	t.Helper()
	res, err := c.Exec(Context(t, 10*time.Second), "TIMELINE_STATUS").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("TIMELINE_STATUS: %v", err)
	}
	row := map[string]string{}
	for i, f := range res[0].FieldDescriptions {
		row[f.Name] = string(res[0].Rows[0][i])
	}
	return row
}

// TimelineStatus is StatusRow over a replication connection of its own to
// sk for timeline tenant/timeline.
func (sk *Safekeeper) TimelineStatus(t testing.TB, tenant, timeline string) map[string]string {
	t.Helper()
	c, err := pgconn.Connect(Context(t, 10*time.Second), sk.ConnString(tenant, timeline)+" sslmode=disable replication=true")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	return StatusRow(t, c)
}

// TimelineStatusLSN is one LSN column of sk's TIMELINE_STATUS.
func (sk *Safekeeper) TimelineStatusLSN(t testing.TB, tenant, timeline, column string) proto.LSN {
	t.Helper()
	l, err := proto.ParseLSN(sk.TimelineStatus(t, tenant, timeline)[column])
	if err != nil {
		t.Fatalf("TIMELINE_STATUS %s: %v", column, err)
	}
	return l
}
