package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by every decoding error: a payload with an unknown
// tag, a wrong length or an invalid field. On a START_WAL_PUSH stream it is a
// protocol violation (SQLSTATE 08P01).
var ErrMalformed = errors.New("proto: malformed message")

// ProtocolVersion is the WAL push protocol version this package speaks:
// 2 added the timeline's configuration to ServerInfo and SafeKeeperInfo
// (README_PROTO.md, "Membership and generations").
const ProtocolVersion = 2

// MaxWALPerRequest is the largest WAL payload of one SafeKeeperRequest (128 KiB).
const MaxWALPerRequest = 128 * 1024

// Message tags of the WAL push protocol (first byte of every CopyData payload).
const (
	TagServerInfo         = 'i'
	TagRequestVote        = 'v'
	TagProposerElected    = 'e'
	TagSafeKeeperRequest  = 'a'
	TagSafeKeeperInfo     = 'I'
	TagVoteResponse       = 'n'
	TagSafeKeeperResponse = 'r'
)

// Message is one WAL push protocol message: the payload of one CopyData.
type Message interface {
	// Tag is the first payload byte.
	Tag() byte
	// Encode appends the whole payload, tag included, to dst.
	Encode(dst []byte) []byte
	// Decode parses a whole payload, tag included. Errors wrap ErrMalformed.
	Decode(src []byte) error
}

// DecodeProposerMessage decodes a payload sent by a proposer: ServerInfo,
// RequestVote, ProposerElected, SafeKeeperRequest, TimelineHistory or Slots.
// The returned message may
// alias src (a SafeKeeperRequest's WAL does).
func DecodeProposerMessage(src []byte) (Message, error) {
	if len(src) == 0 {
		return nil, fmt.Errorf("%w: empty payload", ErrMalformed)
	}
	var m Message
	switch src[0] {
	case TagServerInfo:
		m = &ServerInfo{}
	case TagRequestVote:
		m = &RequestVote{}
	case TagProposerElected:
		m = &ProposerElected{}
	case TagSafeKeeperRequest:
		m = &SafeKeeperRequest{}
	case TagTimelineHistory:
		m = &TimelineHistory{}
	case TagSlots:
		m = &Slots{}
	default:
		return nil, fmt.Errorf("%w: unknown proposer message tag %q", ErrMalformed, src[0])
	}
	if err := m.Decode(src); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeSafeKeeperMessage decodes a payload sent by a safekeeper:
// SafeKeeperInfo, VoteResponse, SafeKeeperResponse or SafeKeeperSlots.
func DecodeSafeKeeperMessage(src []byte) (Message, error) {
	if len(src) == 0 {
		return nil, fmt.Errorf("%w: empty payload", ErrMalformed)
	}
	var m Message
	switch src[0] {
	case TagSafeKeeperInfo:
		m = &SafeKeeperInfo{}
	case TagVoteResponse:
		m = &VoteResponse{}
	case TagSafeKeeperResponse:
		m = &SafeKeeperResponse{}
	case TagSafeKeeperSlots:
		m = &SafeKeeperSlots{}
	default:
		return nil, fmt.Errorf("%w: unknown safekeeper message tag %q", ErrMalformed, src[0])
	}
	if err := m.Decode(src); err != nil {
		return nil, err
	}
	return m, nil
}

// reader consumes big-endian fields; the first short read sets err and every
// later read returns zero.
type reader struct {
	b    []byte
	what string
	err  error
}

func newReader(src []byte, tag byte, what string) *reader {
	r := &reader{b: src, what: what}
	if len(src) == 0 || src[0] != tag {
		r.err = fmt.Errorf("%w: %s: want tag %q", ErrMalformed, what, tag)
		return r
	}
	r.b = src[1:]
	return r
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("%w: %s: truncated", ErrMalformed, r.what)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) i64() int64 { return int64(r.u64()) }
func (r *reader) lsn() LSN   { return LSN(r.u64()) }

func (r *reader) id() ID {
	var id ID
	if b := r.take(16); b != nil {
		copy(id[:], b)
	}
	return id
}

func (r *reader) ballot() Ballot { return Ballot{Term: r.u64(), UUID: r.id()} }

// maxHistory bounds a decoded TermHistory so a hostile length cannot make us
// allocate much: every entry takes 16 bytes of the payload anyway.
func (r *reader) history() TermHistory {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(n)*16 > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: %s: term history of %d entries does not fit in %d bytes", ErrMalformed, r.what, n, len(r.b))
		return nil
	}
	h := make(TermHistory, n)
	for i := range h {
		h[i] = TermSwitch{Term: r.u64(), StartLSN: r.lsn()}
	}
	if err := h.Validate(); err != nil && r.err == nil {
		r.err = fmt.Errorf("%s: %w", r.what, err)
	}
	return h
}

// done checks the whole payload was consumed.
func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %s: %d trailing bytes", ErrMalformed, r.what, len(r.b))
	}
	return r.err
}

func putU32(b []byte, v uint32) []byte    { return binary.BigEndian.AppendUint32(b, v) }
func putU64(b []byte, v uint64) []byte    { return binary.BigEndian.AppendUint64(b, v) }
func putLSN(b []byte, v LSN) []byte       { return putU64(b, uint64(v)) }
func putID(b []byte, v ID) []byte         { return append(b, v[:]...) }
func putBallot(b []byte, v Ballot) []byte { return putID(putU64(b, v.Term), v.UUID) }

func putHistory(b []byte, h TermHistory) []byte {
	b = putU32(b, uint32(len(h)))
	for _, e := range h {
		b = putLSN(putU64(b, e.Term), e.StartLSN)
	}
	return b
}
