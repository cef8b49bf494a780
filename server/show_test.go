package server

import (
	"testing"
	"time"
)

// TestFormatMSLikePostgres: SHOW of a millisecond setting prints the largest
// unit that divides it exactly, as PostgreSQL's GUC display does.
func TestFormatMSLikePostgres(t *testing.T) {
	for d, want := range map[time.Duration]string{
		60 * time.Second:        "1min",
		90 * time.Second:        "90s",
		time.Second:             "1s",
		1500 * time.Millisecond: "1500ms",
		time.Hour:               "1h",
		24 * time.Hour:          "1d",
		0:                       "0",
		-1:                      "0",
	} {
		if got := formatMS(d); got != want {
			t.Errorf("formatMS(%v) = %q, want %q", d, got, want)
		}
	}
}
