package replcmd_test

import (
	"testing"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
)

// replcmd parses RESERVE_WAL's value with its own copy of PostgreSQL's
// parse_bool, since it may not import the transport; these tests hold the
// copy to proto/pgwire.ParseBool, the same rule for startup parameters.
// (An empty value, reserve_wal '', reads as no value and so as true, as it
// always has: the grammar keeps no difference between the two.)

func reserveWAL(v string) (bool, error) {
	cmd, err := replcmd.Parse("CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal '" + v + "')")
	if err != nil {
		return false, err
	}
	return cmd.(replcmd.CreateSlot).ReserveWAL, nil
}

func sameBool(t *testing.T, v string) {
	got, err := reserveWAL(v)
	want, werr := pgwire.ParseBool(v)
	if (err == nil) != (werr == nil) || got != want {
		t.Errorf("reserve_wal %q: %v, %v; pgwire.ParseBool: %v, %v", v, got, err, want, werr)
	}
}

func TestReserveWALIsParseBool(t *testing.T) {
	for _, v := range []string{"t", "tr", "TRUE", "f", "False", "y", "yes", "YE", "n", "no", "on", "ON", "of", "off", "OFF",
		"1", "0", "o", "10", "01", "truex", "nope", "onn", "2", "x", "é"} {
		sameBool(t, v)
	}
}

func FuzzReserveWALIsParseBool(f *testing.F) {
	for _, v := range []string{"on", "of", "o", "true", "1", "0", "no"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if v == "" {
			t.Skip() // no value: true
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; c == '\'' || c < 'A' && !(c >= '0' && c <= '9') {
				t.Skip() // only a quoted string without quotes or blanks
			}
		}
		sameBool(t, v)
	})
}
