package harness

import (
	"testing"
)

// TestReplaceSection: only the named section changes, its markers stay on
// their own lines, a second rewrite with the same body changes nothing;
// missing, reversed or repeated markers are an error.
func TestReplaceSection(t *testing.T) {
	doc := "# P\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n<!-- b:begin -->\nkeep\n<!-- b:end -->\n"
	out, err := ReplaceSection([]byte(doc), "a", "new\ntable\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# P\n\n<!-- a:begin -->\nnew\ntable\n<!-- a:end -->\n\n<!-- b:begin -->\nkeep\n<!-- b:end -->\n"
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	// Rewriting again changes nothing else: the markers stay.
	again, err := ReplaceSection(out, "a", "new\ntable")
	if err != nil || string(again) != want {
		t.Fatalf("second rewrite: %v\n%s", err, again)
	}
	for _, bad := range []string{"no markers", "<!-- a:end --><!-- a:begin -->", "<!-- a:begin --><!-- a:begin --><!-- a:end -->",
		"<!-- a:begin --><!-- a:end --><!-- a:end -->"} {
		if _, err := ReplaceSection([]byte(bad), "a", "x"); err == nil {
			t.Errorf("ReplaceSection(%q) did not fail", bad)
		}
	}
}
