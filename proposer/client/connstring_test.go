package client

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestCheckConnStringTakesLibpqKeywordsOnly: a connection string is
// checked against libpq 15's keywords: an unknown one (a typo) is named,
// with the keyword it was probably meant to be; one of libpq's that pgconn
// would send to the server as a setting is named as unsupported; libpq's
// others pass, in keyword/value and URL form.
func TestCheckConnStringTakesLibpqKeywordsOnly(t *testing.T) {
	for _, ok := range []string{
		"host=127.0.0.1 port=5432 user=postgres sslmode=disable",
		"host=/var/run/postgresql port=5432 user=postgres dbname=postgres application_name=x connect_timeout=5 options='-c wal_sender_timeout=5s' client_encoding=UTF8",
		"postgresql://postgres@127.0.0.1:5432/postgres?sslmode=disable&application_name=x",
		"host=127.0.0.1 target_session_attrs=read-write channel_binding=prefer sslsni=1 krbsrvname=postgres",
	} {
		if err := CheckConnString(ok); err != nil {
			t.Errorf("CheckConnString(%q): %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct {
		s, keyword, suggest string
		unsupported         bool
	}{
		{"hots=127.0.0.1 port=5432", "hots", "host", false},
		{"host=127.0.0.1 prot=5432", "prot", "port", false},
		{"postgres://u@127.0.0.1:5432/db?hots=1", "hots", "host", false},
		{"host=127.0.0.1 wal_sender_timeout=5s", "wal_sender_timeout", "", false},
		{"host=127.0.0.1 servicefile=/etc/pg_service.conf", "servicefile", "", false},
		{"host=127.0.0.1 keepalives=1", "keepalives", "", true},
		{"host=127.0.0.1 hostaddr=127.0.0.1", "hostaddr", "", true},
		{"host=127.0.0.1 requirepeer=postgres", "requirepeer", "", true},
	} {
		err := CheckConnString(tc.s)
		var ce *ConnStringError
		if !errors.As(err, &ce) || ce.Keyword != tc.keyword || ce.Suggest != tc.suggest || ce.Unsupported != tc.unsupported {
			t.Errorf("CheckConnString(%q): %#v (%v); want keyword %q, suggest %q, unsupported %v", tc.s, err, err, tc.keyword, tc.suggest, tc.unsupported)
		}
	}
	var pe *pgconn.ParseConfigError
	if err := CheckConnString("host=127.0.0.1 port='5432"); !errors.As(err, &pe) {
		t.Errorf("an unterminated quote: %v, want pgconn's *ParseConfigError", err)
	}
}
