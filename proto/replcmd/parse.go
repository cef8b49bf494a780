package replcmd

import (
	"strconv"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
)

// Token kinds.
type tokKind int

const (
	tokEOF     tokKind = iota
	tokKeyword         // an upper-case word that is a keyword (text as written)
	tokIdent           // identifier, folded to lower case, or "quoted"
	tokNumber          // unsigned decimal
	tokLSN             // hex/hex
	tokString          // 'single quoted'
	tokPunct           // ( ) , ; .
)

type token struct {
	kind tokKind
	text string
}

var keywords = map[string]bool{
	"IDENTIFY_SYSTEM": true, "SHOW": true, "TIMELINE_HISTORY": true, "READ_REPLICATION_SLOT": true,
	"CREATE_REPLICATION_SLOT": true, "DROP_REPLICATION_SLOT": true, "START_REPLICATION": true,
	"BASE_BACKUP": true, "SLOT": true, "PHYSICAL": true, "LOGICAL": true, "TIMELINE": true,
	"TEMPORARY": true, "RESERVE_WAL": true, "WAIT": true, "EXPORT_SNAPSHOT": true,
	"NOEXPORT_SNAPSHOT": true, "USE_SNAPSHOT": true, "TWO_PHASE": true,
	"TIMELINE_STATUS": true, "START_WAL_PUSH": true,
}

// commandKeywords start a replication command (repl_scanner's
// replication_scanner_is_replication_command).
var commandKeywords = map[string]bool{
	"IDENTIFY_SYSTEM": true, "SHOW": true, "TIMELINE_HISTORY": true, "READ_REPLICATION_SLOT": true,
	"CREATE_REPLICATION_SLOT": true, "DROP_REPLICATION_SLOT": true, "START_REPLICATION": true,
	"BASE_BACKUP": true, "TIMELINE_STATUS": true, "START_WAL_PUSH": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func isIdentCont(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' || c == '$' }

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func scan(s string) ([]token, error) {
	var out []token
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '(' || c == ')' || c == ',' || c == ';' || c == '.':
			out = append(out, token{tokPunct, string(c)})
			i++
		case c == '"':
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(s) {
					return nil, syntaxErr("unterminated quoted identifier")
				}
				if s[j] == '"' {
					if j+1 < len(s) && s[j+1] == '"' {
						b.WriteByte('"')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(s[j])
				j++
			}
			if b.Len() == 0 {
				return nil, syntaxErr("zero-length delimited identifier")
			}
			out = append(out, token{tokIdent, b.String()})
			i = j + 1
		case c == '\'':
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(s) {
					return nil, syntaxErr("unterminated quoted string")
				}
				if s[j] == '\'' {
					if j+1 < len(s) && s[j+1] == '\'' {
						b.WriteByte('\'')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(s[j])
				j++
			}
			out = append(out, token{tokString, b.String()})
			i = j + 1
		case isHex(c):
			// A number, an LSN (hex/hex) or an identifier starting with a
			// hex letter.
			j := i
			for j < len(s) && isHex(s[j]) {
				j++
			}
			if j < len(s) && s[j] == '/' {
				k := j + 1
				for k < len(s) && isHex(s[k]) {
					k++
				}
				if k == j+1 {
					return nil, syntaxErr("invalid LSN %q", s[i:k])
				}
				out = append(out, token{tokLSN, s[i:k]})
				i = k
				continue
			}
			if isDigits(s[i:j]) && (j == len(s) || !isIdentCont(s[j])) {
				out = append(out, token{tokNumber, s[i:j]})
				i = j
				continue
			}
			if !isIdentStart(c) {
				return nil, syntaxErr("at or near %q", s[i:j])
			}
			fallthrough
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentCont(s[j]) {
				j++
			}
			w := s[i:j]
			if keywords[w] {
				out = append(out, token{tokKeyword, w})
			} else {
				out = append(out, token{tokIdent, strings.ToLower(w)})
			}
			i = j
		default:
			return nil, syntaxErr("at or near %q", string(c))
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parser walks the tokens of one command.
type parser struct {
	toks []token
	i    int
}

func (p *parser) peek() token {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return token{kind: tokEOF}
}

func (p *parser) next() token { t := p.peek(); p.i++; return t }

func (p *parser) isKeyword(k string) bool {
	t := p.peek()
	return t.kind == tokKeyword && t.text == k
}

func (p *parser) acceptKeyword(k string) bool {
	if p.isKeyword(k) {
		p.i++
		return true
	}
	return false
}

func (p *parser) acceptPunct(c string) bool {
	if t := p.peek(); t.kind == tokPunct && t.text == c {
		p.i++
		return true
	}
	return false
}

func (p *parser) unexpected() error {
	t := p.peek()
	if t.kind == tokEOF {
		return syntaxErr("unexpected end of command")
	}
	return syntaxErr("at or near %q", t.text)
}

// slotName reads a slot name: an identifier or a keyword used as one.
func (p *parser) slotName() (string, error) {
	t := p.peek()
	if t.kind != tokIdent {
		return "", p.unexpected()
	}
	p.i++
	return t.text, nil
}

func (p *parser) uconst() (uint32, error) {
	t := p.peek()
	if t.kind != tokNumber {
		return 0, p.unexpected()
	}
	p.i++
	v, err := strconv.ParseUint(t.text, 10, 32)
	if err != nil {
		return 0, syntaxErr("number %s out of range", t.text)
	}
	return uint32(v), nil
}

// end accepts an optional ';' and requires the end of the command.
func (p *parser) end() error {
	p.acceptPunct(";")
	if p.peek().kind != tokEOF {
		return p.unexpected()
	}
	return nil
}

// genericOptions parses "( name [value] [, ...] )" after the '(' and
// returns name → value ("" when absent). Names are case-insensitive.
func (p *parser) genericOptions() (map[string]string, error) {
	opts := map[string]string{}
	for {
		t := p.next()
		if t.kind != tokIdent && t.kind != tokKeyword {
			p.i--
			return nil, p.unexpected()
		}
		name := strings.ToLower(t.text)
		val := ""
		switch v := p.peek(); v.kind {
		case tokString, tokNumber, tokIdent:
			val = v.text
			p.i++
		case tokKeyword:
			val = strings.ToLower(v.text)
			p.i++
		}
		opts[name] = val
		if p.acceptPunct(")") {
			return opts, nil
		}
		if !p.acceptPunct(",") {
			return nil, p.unexpected()
		}
	}
}

// Parse parses one query string. Every error is an *Error (ErrSyntax or
// ErrUnsupported); text that is not a replication command is SQL, not an
// error.
func Parse(q string) (Command, error) {
	trimmed := strings.TrimSpace(q)
	if trimmed == "" || trimmed == ";" {
		return Empty{}, nil
	}
	if strings.EqualFold(strings.TrimSpace(strings.TrimSuffix(trimmed, ";")), "START_WAL_PUSH") {
		return StartWALPush{AllowTimelineCreation: true}, nil
	}
	toks, err := scan(q)
	if err != nil {
		// Not even tokens: if it does not start with a command keyword it
		// is SQL (PostgreSQL's scanner decides on the first token only).
		if w := firstWord(trimmed); !commandKeywords[w] {
			return SQL{Text: q}, nil
		}
		return nil, err
	}
	if len(toks) == 0 || toks[0].kind != tokKeyword || !commandKeywords[toks[0].text] {
		return SQL{Text: q}, nil
	}
	p := &parser{toks: toks, i: 1}
	cmd, err := p.command(toks[0].text)
	if err != nil {
		return nil, err
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// command parses the arguments of the command named by keyword kw (the
// first token, already taken).
func (p *parser) command(kw string) (Command, error) {
	switch kw {
	case "IDENTIFY_SYSTEM":
		return IdentifySystem{}, nil
	case "TIMELINE_STATUS":
		return TimelineStatus{}, nil
	case "START_WAL_PUSH":
		return p.startWALPush()
	case "BASE_BACKUP":
		return nil, unsupported("BASE_BACKUP is not supported by a safekeeper: take base backups from the primary")
	case "SHOW":
		return p.show()
	case "TIMELINE_HISTORY":
		tli, err := p.uconst()
		if err != nil {
			return nil, err
		}
		if tli == 0 {
			return nil, invalidErr("invalid timeline %d", tli)
		}
		return TimelineHistory{TLI: tli}, nil
	case "READ_REPLICATION_SLOT":
		s, err := p.slotName()
		if err != nil {
			return nil, err
		}
		return ReadSlot{Slot: s}, nil
	case "DROP_REPLICATION_SLOT":
		s, err := p.slotName()
		if err != nil {
			return nil, err
		}
		return DropSlot{Slot: s, Wait: p.acceptKeyword("WAIT")}, nil
	case "CREATE_REPLICATION_SLOT":
		return p.createSlot()
	case "START_REPLICATION":
		return p.startReplication()
	}
	return nil, syntaxErr("at or near %q", kw) // commandKeywords and this switch disagree: not reached
}

// startWALPush parses START_WAL_PUSH's options.
func (p *parser) startWALPush() (Command, error) {
	c := StartWALPush{AllowTimelineCreation: true}
	if !p.acceptPunct("(") {
		return c, nil
	}
	opts, err := p.genericOptions()
	if err != nil {
		return nil, err
	}
	for k, v := range opts {
		b, ok := true, true
		if v != "" {
			b, ok = parseBool(v)
		}
		switch {
		case k != "allow_timeline_creation" && k != "sync_replication_slots":
			return nil, invalidErr("unrecognized option: %s", k)
		case !ok:
			return nil, invalidErr("%s requires a Boolean value", k)
		case k == "allow_timeline_creation":
			c.AllowTimelineCreation = b
		default:
			c.SyncReplicationSlots = b
		}
	}
	return c, nil
}

// show parses SHOW's variable name (parts joined by '.', folded to lower
// case).
func (p *parser) show() (Command, error) {
	t := p.next()
	if t.kind != tokIdent && t.kind != tokKeyword {
		p.i--
		return nil, p.unexpected()
	}
	name := strings.ToLower(t.text)
	for p.acceptPunct(".") {
		t := p.next()
		if t.kind != tokIdent && t.kind != tokKeyword {
			p.i--
			return nil, p.unexpected()
		}
		name += "." + strings.ToLower(t.text)
	}
	return Show{Var: name}, nil
}

// createSlot parses CREATE_REPLICATION_SLOT's arguments.
func (p *parser) createSlot() (Command, error) {
	c := CreateSlot{}
	var err error
	if c.Slot, err = p.slotName(); err != nil {
		return nil, err
	}
	c.Temporary = p.acceptKeyword("TEMPORARY")
	if p.isKeyword("LOGICAL") {
		return nil, unsupported("logical replication slots are not supported by a safekeeper")
	}
	if !p.acceptKeyword("PHYSICAL") {
		return nil, p.unexpected()
	}
	if !p.acceptPunct("(") {
		c.ReserveWAL = p.acceptKeyword("RESERVE_WAL")
		return c, nil
	}
	opts, err := p.genericOptions()
	if err != nil {
		return nil, err
	}
	for k, v := range opts {
		if k != "reserve_wal" {
			return nil, invalidErr("unrecognized option: %s", k)
		}
		b, ok := true, true
		if v != "" {
			b, ok = parseBool(v)
		}
		if !ok {
			return nil, invalidErr("reserve_wal requires a Boolean value")
		}
		c.ReserveWAL = b
	}
	return c, nil
}

// startReplication parses START_REPLICATION's arguments.
func (p *parser) startReplication() (Command, error) {
	c := StartReplication{}
	var err error
	if p.acceptKeyword("SLOT") {
		if c.Slot, err = p.slotName(); err != nil {
			return nil, err
		}
	}
	if p.isKeyword("LOGICAL") {
		return nil, unsupported("logical replication is not supported by a safekeeper")
	}
	p.acceptKeyword("PHYSICAL")
	t := p.next()
	if t.kind != tokLSN {
		p.i--
		return nil, p.unexpected()
	}
	if c.Start, err = proto.ParseLSN(t.text); err != nil {
		return nil, syntaxErr("invalid streaming start location %q", t.text)
	}
	if p.acceptKeyword("TIMELINE") {
		if c.TLI, err = p.uconst(); err != nil {
			return nil, err
		}
		if c.TLI == 0 {
			return nil, invalidErr("invalid timeline %d", c.TLI)
		}
	}
	if !p.acceptPunct("(") {
		return c, nil
	}
	opts, err := p.genericOptions()
	if err != nil {
		return nil, err
	}
	for k, v := range opts {
		if k != "term" {
			return nil, invalidErr("unrecognized option: %s", k)
		}
		if c.Term, err = strconv.ParseUint(v, 10, 64); err != nil || c.Term == 0 {
			return nil, invalidErr("term requires a positive integer value, got %q", v)
		}
		c.HasTerm = true
	}
	return c, nil
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

// parseBool is PostgreSQL's parse_bool, for an option's value: any
// case-insensitive prefix of "true", "false", "yes", "no", at least two
// letters of "on" or "off", or exactly "1" or "0". ok is false for anything
// else. (proto/pgwire.ParseBool is the same rule for startup parameters;
// parsebool_test.go holds the two to each other.)
func parseBool(s string) (v, ok bool) {
	if s == "" {
		return false, false
	}
	l := strings.ToLower(s)
	switch l[0] {
	case 't':
		return true, strings.HasPrefix("true", l)
	case 'f':
		return false, strings.HasPrefix("false", l)
	case 'y':
		return true, strings.HasPrefix("yes", l)
	case 'n':
		return false, strings.HasPrefix("no", l)
	case 'o':
		// "o" alone is ambiguous
		if len(l) >= 2 && strings.HasPrefix("on", l) {
			return true, true
		}
		return false, len(l) >= 2 && strings.HasPrefix("off", l)
	case '1':
		return true, l == "1"
	case '0':
		return false, l == "0"
	}
	return false, false
}
