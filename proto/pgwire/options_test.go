package pgwire

import (
	"errors"
	"maps"
	"testing"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
	}{
		{"", map[string]string{}},
		{"   ", map[string]string{}},
		{"-c wal_sender_timeout=30s", map[string]string{"wal_sender_timeout": "30s"}},
		{"-c tenant_id=ab -c timeline_id=cd", map[string]string{"tenant_id": "ab", "timeline_id": "cd"}},
		{"-c tenant_id=ab timeline_id=cd", map[string]string{"tenant_id": "ab", "timeline_id": "cd"}}, // Neon's form
		{"-ctenant_id=ab\t--timeline-id=cd", map[string]string{"tenant_id": "ab", "timeline_id": "cd"}},
		{"--sk.tenant=t1", map[string]string{"sk.tenant": "t1"}},
		{`-c search_path=a\ b -c x=\\ -c y=1\=2`, map[string]string{"search_path": "a b", "x": `\`, "y": "1=2"}},
		{`-c a=1 -c a=2`, map[string]string{"a": "2"}},
		{`-c empty=`, map[string]string{"empty": ""}},
		{`-c a=x\`, map[string]string{"a": "x"}}, // a trailing backslash is dropped
		{"\n-c\va=1\r\f", map[string]string{"a": "1"}},
		// Names are case-insensitive, as PostgreSQL's; values keep their case.
		{"-c TENANT_ID=AB --Timeline-Id=Cd", map[string]string{"tenant_id": "AB", "timeline_id": "Cd"}},
		{"-c tenant_id=ab -c Tenant_Id=cd", map[string]string{"tenant_id": "cd"}},
		{"-c Sk.\u212Aey=1", map[string]string{"sk.\u212aey": "1"}}, // ASCII letters only (not the Kelvin sign)
	} {
		got, err := ParseOptions(tc.in)
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("ParseOptions(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{
		"tenant_id=ab", // bare setting before any -c
		"-c",           // -c without argument
		"-c tenant_id", // no value
		"-c =x",        // no name
		"--tenant_id",  // no value
		"-B 1000",      // other postgres switches
		"-c a=1 word",  // bare word without =
		`-c a=1 \`,     // an empty word
	} {
		_, err := ParseOptions(bad)
		var e *Error
		if !errors.As(err, &e) || e.Code != InvalidParameterValue {
			t.Errorf("ParseOptions(%q) err = %v, want 22023", bad, err)
		}
	}
}

func TestParseBool(t *testing.T) {
	for in, want := range map[string]bool{
		"true": true, "t": true, "TRUE": true, "tr": true, "on": true, "ON": true, "yes": true, "y": true, "1": true,
		"false": false, "f": false, "off": false, "of": false, "no": false, "n": false, "0": false, "No": false,
	} {
		if got, err := ParseBool(in); err != nil || got != want {
			t.Errorf("ParseBool(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "o", "truex", "2", "10", "database", " true", "yess", "onn"} {
		if _, err := ParseBool(bad); err == nil {
			t.Errorf("ParseBool(%q) succeeded", bad)
		}
	}
}

func TestParseReplication(t *testing.T) {
	for in, want := range map[string]Replication{
		"": ReplicationOff, "false": ReplicationOff, "0": ReplicationOff,
		"true": ReplicationPhysical, "on": ReplicationPhysical, "yes": ReplicationPhysical, "1": ReplicationPhysical,
		"database": ReplicationLogical,
	} {
		if got, err := ParseReplication(in); err != nil || got != want {
			t.Errorf("ParseReplication(%q) = %v, %v", in, got, err)
		}
	}
	_, err := ParseReplication("Database")
	var e *Error
	if !errors.As(err, &e) || e.Code != InvalidParameterValue || e.Hint == "" {
		t.Errorf("ParseReplication(Database) err = %v", err)
	}
}
