package pgwire

import (
	"strings"
)

// ParseOptions parses the StartupMessage "options" value the way PostgreSQL
// does (pg_split_opts, then process_postgres_switches), for the forms this
// server accepts, and returns the settings by name:
//
//	-c name=value      (also -cname=value)
//	--name=value
//	name=value         a bare setting after a -c one, as in
//	                   "-c tenant_id=X timeline_id=Y" (Neon's form)
//
// Words are separated by ASCII white space; a backslash makes the next
// character literal (so "\ " is a space inside a value and "\\" a
// backslash), as libpq users write it. Dashes in names become underscores,
// like PostgreSQL's ParseLongOption, and names are folded to lower case
// (ASCII only), as PostgreSQL compares setting names: "-c TENANT_ID=x" sets
// tenant_id, and cannot slip past a check of it. A later setting of a name
// replaces an earlier one, whatever the case of either. Any other switch or a word without "=" is an
// error (an *Error with InvalidParameterValue). The empty string gives an
// empty map.
func ParseOptions(s string) (map[string]string, error) {
	words := splitOptions(s)
	out := make(map[string]string)
	seenC := false
	for i := 0; i < len(words); i++ {
		w := words[i]
		var setting string
		switch {
		case w == "-c":
			if i+1 >= len(words) {
				return nil, Errorf(InvalidParameterValue, "invalid options %q: -c requires a name=value argument", s)
			}
			i++
			setting = words[i]
			seenC = true
		case strings.HasPrefix(w, "--"):
			setting = w[2:]
		case strings.HasPrefix(w, "-c"):
			setting = w[2:]
			seenC = true
		case strings.HasPrefix(w, "-"):
			return nil, Errorf(InvalidParameterValue, "invalid options %q: unsupported switch %q", s, w)
		case seenC:
			setting = w
		default:
			return nil, Errorf(InvalidParameterValue, "invalid options %q: %q is not a -c or -- setting", s, w)
		}
		name, value, ok := strings.Cut(setting, "=")
		if !ok || name == "" {
			return nil, Errorf(InvalidParameterValue, "invalid options %q: %q is not name=value", s, setting)
		}
		out[foldName(name)] = value
	}
	return out, nil
}

// foldName is a setting's name as PostgreSQL compares it
// (guc_name_compare): dashes as underscores, ASCII letters lower case.
func foldName(name string) string {
	b := []byte(name)
	for i, c := range b {
		switch {
		case c == '-':
			b[i] = '_'
		case 'A' <= c && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// splitOptions is PostgreSQL's pg_split_opts: words separated by white space,
// a backslash escaping the next character (a trailing one is dropped).
func splitOptions(s string) []string {
	var words []string
	var w strings.Builder
	inWord, escaped := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case escaped:
			w.WriteByte(ch)
			escaped = false
		case ch == '\\':
			escaped, inWord = true, true
		case isSpace(ch):
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// ParseBool parses a boolean setting as PostgreSQL's parse_bool does: any
// case-insensitive prefix of "true", "false", "yes", "no", at least two
// letters of "on" or "off", or exactly "1" or "0".
func ParseBool(s string) (bool, error) {
	if s != "" {
		l := strings.ToLower(s)
		switch l[0] {
		case 't':
			if strings.HasPrefix("true", l) {
				return true, nil
			}
		case 'f':
			if strings.HasPrefix("false", l) {
				return false, nil
			}
		case 'y':
			if strings.HasPrefix("yes", l) {
				return true, nil
			}
		case 'n':
			if strings.HasPrefix("no", l) {
				return false, nil
			}
		case 'o':
			// "o" alone is ambiguous
			if len(l) >= 2 && strings.HasPrefix("on", l) {
				return true, nil
			}
			if len(l) >= 2 && strings.HasPrefix("off", l) {
				return false, nil
			}
		case '1':
			if l == "1" {
				return true, nil
			}
		case '0':
			if l == "0" {
				return false, nil
			}
		}
	}
	return false, Errorf(InvalidParameterValue, "invalid boolean value %q", s)
}

// Replication is the kind of connection the "replication" startup parameter
// asks for.
type Replication int

const (
	// ReplicationOff: an ordinary connection ("replication" absent or false).
	ReplicationOff Replication = iota
	// ReplicationPhysical: a physical walsender (true/on/yes/1).
	ReplicationPhysical
	// ReplicationLogical: a database walsender ("database").
	ReplicationLogical
)

func (r Replication) String() string {
	switch r {
	case ReplicationOff:
		return "off"
	case ReplicationPhysical:
		return "physical"
	case ReplicationLogical:
		return "database"
	}
	return "invalid"
}

// ParseReplication parses the "replication" startup parameter as PostgreSQL
// does: "" (absent) is ReplicationOff, exactly "database" is
// ReplicationLogical, anything else goes through ParseBool. An invalid value
// is an *Error with InvalidParameterValue (22023), PostgreSQL's text and hint.
func ParseReplication(s string) (Replication, error) {
	if s == "" {
		return ReplicationOff, nil
	}
	if s == "database" {
		return ReplicationLogical, nil
	}
	b, err := ParseBool(s)
	if err != nil {
		e := Errorf(InvalidParameterValue, "invalid value for parameter \"replication\": %q", s)
		e.Hint = `Valid values are: "false", 0, "true", 1, "database".`
		return ReplicationOff, e
	}
	if b {
		return ReplicationPhysical, nil
	}
	return ReplicationOff, nil
}
