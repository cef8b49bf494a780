package proto

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckSlotName: PostgreSQL's ReplicationSlotValidateName, with its
// message texts.
func TestCheckSlotName(t *testing.T) {
	for _, ok := range []string{"a", "proposer", "pg_walreceiver_123", "0", "_", strings.Repeat("s", MaxSlotNameLen)} {
		if err := CheckSlotName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	cases := []struct {
		name   string
		reason SlotNameReason
		msg    string
	}{
		{"", SlotNameTooShort, `replication slot name "" is too short`},
		{strings.Repeat("s", MaxSlotNameLen+1), SlotNameTooLong, `replication slot name "` + strings.Repeat("s", 64) + `" is too long`},
		{strings.Repeat("S", MaxSlotNameLen+1), SlotNameTooLong, `replication slot name "` + strings.Repeat("S", 64) + `" is too long`},
		{"Bad", SlotNameInvalidCharacter, `replication slot name "Bad" contains invalid character`},
		{"a-b", SlotNameInvalidCharacter, `replication slot name "a-b" contains invalid character`},
		{"a b", SlotNameInvalidCharacter, `replication slot name "a b" contains invalid character`},
		{`a"b`, SlotNameInvalidCharacter, `replication slot name "a\"b" contains invalid character`},
		{"é", SlotNameInvalidCharacter, `replication slot name "é" contains invalid character`},
		{"a\x00", SlotNameInvalidCharacter, `replication slot name "a\x00" contains invalid character`},
	}
	for _, c := range cases {
		err := CheckSlotName(c.name)
		var se *SlotNameError
		if !errors.Is(err, ErrBadSlotName) || !errors.As(err, &se) || se.Name != c.name || se.Reason != c.reason {
			t.Errorf("%q: %#v, want reason %v", c.name, err, c.reason)
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("%q: message %q, want %q", c.name, err.Error(), c.msg)
		}
		if hint := se.Hint(); (hint != "") != (c.reason == SlotNameInvalidCharacter) {
			t.Errorf("%q: hint %q", c.name, hint)
		}
	}
}
