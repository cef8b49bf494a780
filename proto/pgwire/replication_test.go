package pgwire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var testTime = time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)

func TestTimeToPG(t *testing.T) {
	if got := TimeToPG(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); got != 0 {
		t.Errorf("epoch = %d", got)
	}
	if got := TimeToPG(time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)); got != -1 {
		t.Errorf("epoch-1µs = %d", got)
	}
	want := testTime.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
	if got := TimeToPG(testTime); got != want {
		t.Errorf("TimeToPG = %d, want %d", got, want)
	}
	if got := PGToTime(want); !got.Equal(testTime) || got.Location() != time.UTC {
		t.Errorf("PGToTime = %v", got)
	}
	for _, us := range []int64{0, 1, -1, 999999, -999999, -1000000, 1000001, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		if got := TimeToPG(PGToTime(us)); got != us {
			t.Errorf("round trip %d = %d", us, got)
		}
	}
}

// Golden bytes for XLogData, cross-checked with pglogrepl's client parser.
func TestXLogDataGolden(t *testing.T) {
	m := XLogData{DataStart: 0x1_0000_0010, WALEnd: 0x1_BC36_C4D8, SendTime: 0x0102030405060708, Data: []byte("AB")}
	want := unhex(t, `77  00000001 00000010  00000001 BC36C4D8  01020304 05060708  4142`)
	got := m.Append(nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("XLogData = %x\nwant       %x", got, want)
	}
	if len(got)-len(m.Data) != XLogDataHeaderLen || XLogDataHeaderLen != 25 {
		t.Fatalf("header length %d", len(got)-len(m.Data))
	}
	back, err := ParseXLogData(got)
	if err != nil || back.DataStart != m.DataStart || back.WALEnd != m.WALEnd || back.SendTime != m.SendTime || string(back.Data) != "AB" {
		t.Fatalf("ParseXLogData = %+v, %v", back, err)
	}

	m.SendTime = TimeToPG(testTime) // a time pglogrepl's conversion can hold
	x, err := pglogrepl.ParseXLogData(m.Append(nil)[1:])
	if err != nil {
		t.Fatal(err)
	}
	if uint64(x.WALStart) != uint64(m.DataStart) || uint64(x.ServerWALEnd) != uint64(m.WALEnd) ||
		!x.ServerTime.Equal(testTime) || string(x.WALData) != "AB" {
		t.Fatalf("pglogrepl.ParseXLogData = %+v", x)
	}
	if _, err := ParseXLogData(want[:24]); !errors.Is(err, ErrMalformed) {
		t.Errorf("short XLogData: %v", err)
	}
}

// Golden bytes for the keepalive (exactly 18 bytes), cross-checked with
// pglogrepl's client parser.
func TestPrimaryKeepaliveGolden(t *testing.T) {
	m := PrimaryKeepalive{WALEnd: 0xBC36C4D8, SendTime: 1, ReplyRequested: true}
	want := unhex(t, `6B  00000000 BC36C4D8  00000000 00000001  01`)
	got := m.Append(nil)
	if !bytes.Equal(got, want) || len(got) != PrimaryKeepaliveLen || PrimaryKeepaliveLen != 18 {
		t.Fatalf("keepalive = %x, want %x", got, want)
	}
	if back, err := ParsePrimaryKeepalive(got); err != nil || back != m {
		t.Fatalf("ParsePrimaryKeepalive = %+v, %v", back, err)
	}
	m.SendTime = TimeToPG(testTime)
	k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Append(nil)[1:])
	if err != nil || uint64(k.ServerWALEnd) != 0xBC36C4D8 || !k.ServerTime.Equal(testTime) || !k.ReplyRequested {
		t.Fatalf("pglogrepl.ParsePrimaryKeepaliveMessage = %+v, %v", k, err)
	}
	for _, n := range []int{17, 19} {
		b := append(append([]byte(nil), want...), 0)[:n]
		if _, err := ParsePrimaryKeepalive(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("keepalive of %d bytes: %v", n, err)
		}
	}
}

// wantMalformed checks err is a ProtocolViolation *Error wrapping ErrMalformed.
func wantMalformed(t *testing.T, what string, err error) {
	t.Helper()
	var e *Error
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &e) || e.Code != ProtocolViolation {
		t.Errorf("%s: err = %v, want malformed 08P01", what, err)
	}
}

func TestStandbyStatusUpdateDecode(t *testing.T) {
	// pg_receivewal trace: write=flush=0/BC36C4D8, apply 0, replyRequested 0.
	b := unhex(t, `72  00000000 BC36C4D8  00000000 BC36C4D8  00000000 00000000  00029E3D 2A8C4F00  00`)
	m, err := ParseStandbyStatusUpdate(b)
	want := StandbyStatusUpdate{Write: 0xBC36C4D8, Flush: 0xBC36C4D8, Apply: 0, SendTime: 0x00029E3D2A8C4F00}
	if err != nil || m != want {
		t.Fatalf("ParseStandbyStatusUpdate = %+v, %v", m, err)
	}
	if !bytes.Equal(m.Append(nil), b) {
		t.Errorf("Append does not round trip")
	}
	b[33] = 1
	if m, _ := ParseStandbyStatusUpdate(b); !m.ReplyRequested {
		t.Error("replyRequested lost")
	}
	wantMalformed(t, "33 bytes", second(ParseStandbyStatusUpdate(b[:33])))
	wantMalformed(t, "35 bytes", second(ParseStandbyStatusUpdate(append(b, 0))))
	b[0] = 'h'
	wantMalformed(t, "wrong tag", second(ParseStandbyStatusUpdate(b)))
	wantMalformed(t, "empty", second(ParseStandbyStatusUpdate(nil)))
}

func TestHotStandbyFeedbackDecode(t *testing.T) {
	b := unhex(t, `68  00000000 0000002A  000003E8 00000001  00000384 00000002`)
	m, err := ParseHotStandbyFeedback(b)
	want := HotStandbyFeedback{SendTime: 42, Xmin: 1000, XminEpoch: 1, CatalogXmin: 900, CatalogXminEpoch: 2}
	if err != nil || m != want {
		t.Fatalf("ParseHotStandbyFeedback = %+v, %v", m, err)
	}
	if m.FullXmin() != 1<<32|1000 || m.FullCatalogXmin() != 2<<32|900 {
		t.Errorf("full xids %x %x", m.FullXmin(), m.FullCatalogXmin())
	}
	if !bytes.Equal(m.Append(nil), b) {
		t.Errorf("Append does not round trip")
	}
	wantMalformed(t, "24 bytes", second(ParseHotStandbyFeedback(b[:24])))
	wantMalformed(t, "26 bytes", second(ParseHotStandbyFeedback(append(b, 0))))
}

// feedback builds a 'z' block by hand: key, value pairs (value nil = a
// 4-byte length of -1).
func feedback(nkeys int, kv ...any) []byte {
	b := []byte{'z', byte(nkeys)}
	for i := 0; i < len(kv); i += 2 {
		b = append(b, kv[i].(string)...)
		b = append(b, 0)
		switch v := kv[i+1].(type) {
		case uint64:
			b = binary.BigEndian.AppendUint32(b, 8)
			b = binary.BigEndian.AppendUint64(b, v)
		case []byte:
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		case int32: // a raw length with no value
			b = binary.BigEndian.AppendUint32(b, uint32(v))
		}
	}
	return b
}

func TestConsumerFeedbackDecode(t *testing.T) {
	b := feedback(7,
		"current_timeline_size", uint64(1<<30),
		"ps_writelsn", uint64(0x3000),
		"unknown_key", []byte("skipped, any length"),
		"ps_flushlsn", uint64(0x2000),
		"ps_applylsn", uint64(0x1000),
		"empty_unknown", []byte{},
		"ps_replytime", uint64(0xFFFFFFFFFFFFFFFF), // -1
	)
	m, err := ParseConsumerFeedback(b)
	want := ConsumerFeedback{TimelineSize: 1 << 30, ReceivedLSN: 0x3000, DiskConsistentLSN: 0x2000, RemoteConsistentLSN: 0x1000, ReplyTime: -1}
	if err != nil || m != want {
		t.Fatalf("ParseConsumerFeedback = %+v, %v", m, err)
	}
	// Append writes the five known keys in the canonical order.
	if back, err := ParseConsumerFeedback(want.Append(nil)); err != nil || back != want {
		t.Fatalf("round trip = %+v, %v", back, err)
	}
	// Missing keys stay zero; nkeys 0 is an empty block.
	if m, err := ParseConsumerFeedback(feedback(1, "ps_flushlsn", uint64(5))); err != nil || m != (ConsumerFeedback{DiskConsistentLSN: 5}) {
		t.Errorf("one key = %+v, %v", m, err)
	}
	if m, err := ParseConsumerFeedback([]byte{'z', 0}); err != nil || m != (ConsumerFeedback{}) {
		t.Errorf("no keys = %+v, %v", m, err)
	}

	for name, bad := range map[string][]byte{
		"empty":                   nil,
		"tag only":                {'z'},
		"wrong tag":               {'r', 0},
		"fewer keys than nkeys":   feedback(2, "ps_writelsn", uint64(1)),
		"trailing bytes":          append(feedback(1, "ps_writelsn", uint64(1)), 0),
		"key not terminated":      {'z', 1, 'p', 's'},
		"no length":               {'z', 1, 'k', 0, 0, 0},
		"negative length":         feedback(1, "x", int32(-1)),
		"length past the end":     feedback(1, "x", int32(100)),
		"known key of 4 bytes":    feedback(1, "ps_writelsn", []byte{0, 0, 0, 1}),
		"known key of 9 bytes":    feedback(1, "ps_replytime", make([]byte, 9)),
		"value cut":               feedback(1, "ps_flushlsn", uint64(1))[:20],
		"more keys than declared": append(feedback(1, "a", []byte{}), feedback(0, "b", []byte{})[2:]...),
	} {
		wantMalformed(t, name, second(ParseConsumerFeedback(bad)))
	}
}

func second[T any](_ T, err error) error { return err }
