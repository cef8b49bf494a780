package harness

import (
	"testing"

	"github.com/safekeeper/safekeeper/test/pgtest"
)

// StandbyOptions configures StartStandby.
type StandbyOptions struct {
	// Tenant and Timeline name the timeline the standby streams.
	Tenant, Timeline string
	// ConnString holds more libpq keywords of its primary_conninfo
	// (sslmode=verify-full sslrootcert=... password=..., say).
	ConnString string
	// Conf holds more postgresql.conf lines of the standby.
	Conf []string
}

// StartStandby starts a hot standby fed by a safekeeper: a base backup of
// primary (pgtest's StartStandby: its own directory and socket) whose
// primary_conninfo is sk's address with the timeline in its startup
// options and application_name standby1. It returns once the standby
// accepts connections; it streams from sk from then on.
func StartStandby(t testing.TB, primary *pgtest.Cluster, sk *Safekeeper, o StandbyOptions) *pgtest.Cluster {
	t.Helper()
	conninfo := sk.ConnString(o.Tenant, o.Timeline) + " application_name=standby1"
	if o.ConnString != "" {
		conninfo += " " + o.ConnString
	}
	return primary.StartStandby(t, pgtest.BackupOptions{PrimaryConninfo: conninfo, Conf: o.Conf})
}
