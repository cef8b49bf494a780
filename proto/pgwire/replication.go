package pgwire

import (
	"bytes"
	"encoding/binary"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// First payload byte of the replication stream messages carried in CopyData
// (docs/serving.md, the stream; README_PROTO.md, Transport).
const (
	TagXLogData            = 'w' // server -> client
	TagPrimaryKeepalive    = 'k' // server -> client
	TagStandbyStatusUpdate = 'r' // client -> server
	TagHotStandbyFeedback  = 'h' // client -> server
	TagConsumerFeedback    = 'z' // client -> server (pageserver-style consumers)
)

// Payload lengths, tag included.
const (
	XLogDataHeaderLen      = 1 + 8 + 8 + 8 // 25
	PrimaryKeepaliveLen    = 1 + 8 + 8 + 1 // 18: the walreceiver rejects any other length
	StandbyStatusUpdateLen = 1 + 8 + 8 + 8 + 8 + 1
	HotStandbyFeedbackLen  = 1 + 8 + 4 + 4 + 4 + 4
)

// pgEpochUnix is 2000-01-01 00:00:00 UTC in Unix seconds.
const pgEpochUnix = 946684800

// TimeToPG converts t to PostgreSQL's TimestampTz: microseconds since
// 2000-01-01 00:00:00 UTC (truncated toward the past).
func TimeToPG(t time.Time) int64 {
	sec := t.Unix() - pgEpochUnix
	return sec*1_000_000 + int64(t.Nanosecond()/1000)
}

// PGToTime converts a PostgreSQL TimestampTz (µs since 2000-01-01 UTC) to a
// time.Time in UTC. TimeToPG(PGToTime(us)) == us for every int64.
func PGToTime(us int64) time.Time {
	sec, rem := us/1_000_000, us%1_000_000
	if rem < 0 {
		sec, rem = sec-1, rem+1_000_000
	}
	return time.Unix(sec+pgEpochUnix, rem*1000).UTC()
}

// XLogData ('w') carries WAL from the server: 'w', dataStart, walEnd,
// sendTime, then the WAL bytes.
type XLogData struct {
	DataStart proto.LSN // LSN of Data[0]
	WALEnd    proto.LSN // the server's end of WAL it may send (its flush/commit LSN)
	SendTime  int64     // µs since 2000-01-01 UTC; see TimeToPG
	Data      []byte
}

// Append appends the payload ('w' + 24-byte header + Data) to dst.
func (m *XLogData) Append(dst []byte) []byte {
	dst = append(dst, TagXLogData)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.DataStart))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.WALEnd))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.SendTime))
	return append(dst, m.Data...)
}

// ParseXLogData decodes an XLogData payload (tag included), as a client does.
// Data aliases payload.
func ParseXLogData(payload []byte) (XLogData, error) {
	if len(payload) < XLogDataHeaderLen || payload[0] != TagXLogData {
		return XLogData{}, malformed("invalid XLogData message: %d bytes", len(payload))
	}
	return XLogData{
		DataStart: proto.LSN(binary.BigEndian.Uint64(payload[1:])),
		WALEnd:    proto.LSN(binary.BigEndian.Uint64(payload[9:])),
		SendTime:  int64(binary.BigEndian.Uint64(payload[17:])),
		Data:      payload[XLogDataHeaderLen:],
	}, nil
}

// PrimaryKeepalive ('k'), exactly 18 bytes: 'k', walEnd, sendTime,
// replyRequested.
type PrimaryKeepalive struct {
	WALEnd         proto.LSN // end of the WAL sent so far
	SendTime       int64     // µs since 2000-01-01 UTC
	ReplyRequested bool      // the client must answer at once with 'r'
}

// Append appends the 18-byte payload to dst.
func (m *PrimaryKeepalive) Append(dst []byte) []byte {
	dst = append(dst, TagPrimaryKeepalive)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.WALEnd))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.SendTime))
	return append(dst, boolByte(m.ReplyRequested))
}

// ParsePrimaryKeepalive decodes a keepalive payload (tag included), as a
// client does. Like the walreceiver, it accepts exactly 18 bytes.
func ParsePrimaryKeepalive(payload []byte) (PrimaryKeepalive, error) {
	if len(payload) != PrimaryKeepaliveLen || payload[0] != TagPrimaryKeepalive {
		return PrimaryKeepalive{}, malformed("invalid keepalive message: %d bytes, want %d", len(payload), PrimaryKeepaliveLen)
	}
	return PrimaryKeepalive{
		WALEnd:         proto.LSN(binary.BigEndian.Uint64(payload[1:])),
		SendTime:       int64(binary.BigEndian.Uint64(payload[9:])),
		ReplyRequested: payload[17] != 0,
	}, nil
}

// StandbyStatusUpdate ('r'), 34 bytes: 'r', write, flush, apply, sendTime,
// replyRequested. 0 means unknown; do not assume Write >= Flush (a
// walreceiver reports its replay position as flush right after connecting).
type StandbyStatusUpdate struct {
	Write          proto.LSN // received
	Flush          proto.LSN // durable on the client
	Apply          proto.LSN // replayed
	SendTime       int64     // µs since 2000-01-01 UTC
	ReplyRequested bool      // the server must answer at once with 'k'
}

// Append appends the 34-byte payload to dst.
func (m *StandbyStatusUpdate) Append(dst []byte) []byte {
	dst = append(dst, TagStandbyStatusUpdate)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.Write))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.Flush))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.Apply))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.SendTime))
	return append(dst, boolByte(m.ReplyRequested))
}

// ParseStandbyStatusUpdate decodes an 'r' payload (tag included) of exactly
// 34 bytes. Errors are ProtocolViolation *Errors wrapping ErrMalformed.
func ParseStandbyStatusUpdate(payload []byte) (StandbyStatusUpdate, error) {
	if len(payload) != StandbyStatusUpdateLen || payload[0] != TagStandbyStatusUpdate {
		return StandbyStatusUpdate{}, malformed("invalid standby status update: %d bytes, want %d", len(payload), StandbyStatusUpdateLen)
	}
	return StandbyStatusUpdate{
		Write:          proto.LSN(binary.BigEndian.Uint64(payload[1:])),
		Flush:          proto.LSN(binary.BigEndian.Uint64(payload[9:])),
		Apply:          proto.LSN(binary.BigEndian.Uint64(payload[17:])),
		SendTime:       int64(binary.BigEndian.Uint64(payload[25:])),
		ReplyRequested: payload[33] != 0,
	}, nil
}

// HotStandbyFeedback ('h'), 25 bytes: 'h', sendTime, xmin, xmin epoch,
// catalog_xmin, catalog_xmin epoch. Zero xids mean "no feedback".
type HotStandbyFeedback struct {
	SendTime         int64 // µs since 2000-01-01 UTC
	Xmin             uint32
	XminEpoch        uint32
	CatalogXmin      uint32
	CatalogXminEpoch uint32
}

// FullXmin returns the 64-bit xmin (epoch<<32 | xmin) and FullCatalogXmin the
// 64-bit catalog_xmin, the form the WAL push SafeKeeperResponse carries.
func (m *HotStandbyFeedback) FullXmin() uint64 { return uint64(m.XminEpoch)<<32 | uint64(m.Xmin) }

// FullCatalogXmin: see FullXmin.
func (m *HotStandbyFeedback) FullCatalogXmin() uint64 {
	return uint64(m.CatalogXminEpoch)<<32 | uint64(m.CatalogXmin)
}

// Append appends the 25-byte payload to dst.
func (m *HotStandbyFeedback) Append(dst []byte) []byte {
	dst = append(dst, TagHotStandbyFeedback)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.SendTime))
	dst = binary.BigEndian.AppendUint32(dst, m.Xmin)
	dst = binary.BigEndian.AppendUint32(dst, m.XminEpoch)
	dst = binary.BigEndian.AppendUint32(dst, m.CatalogXmin)
	return binary.BigEndian.AppendUint32(dst, m.CatalogXminEpoch)
}

// ParseHotStandbyFeedback decodes an 'h' payload (tag included) of exactly
// 25 bytes. Errors are ProtocolViolation *Errors wrapping ErrMalformed.
func ParseHotStandbyFeedback(payload []byte) (HotStandbyFeedback, error) {
	if len(payload) != HotStandbyFeedbackLen || payload[0] != TagHotStandbyFeedback {
		return HotStandbyFeedback{}, malformed("invalid hot standby feedback: %d bytes, want %d", len(payload), HotStandbyFeedbackLen)
	}
	return HotStandbyFeedback{
		SendTime:         int64(binary.BigEndian.Uint64(payload[1:])),
		Xmin:             binary.BigEndian.Uint32(payload[9:]),
		XminEpoch:        binary.BigEndian.Uint32(payload[13:]),
		CatalogXmin:      binary.BigEndian.Uint32(payload[17:]),
		CatalogXminEpoch: binary.BigEndian.Uint32(payload[21:]),
	}, nil
}

// Keys of the consumer feedback ('z') block.
const (
	KeyCurrentTimelineSize = "current_timeline_size"
	KeyPSWriteLSN          = "ps_writelsn"
	KeyPSFlushLSN          = "ps_flushlsn"
	KeyPSApplyLSN          = "ps_applylsn"
	KeyPSReplyTime         = "ps_replytime"
)

// ConsumerFeedback ('z') is the feedback of a pageserver-style consumer:
// 'z', nkeys u8, then nkeys × (key NUL-terminated, len i32, len bytes of
// value). The known keys carry 8-byte big-endian values; unknown keys are
// skipped. A key absent from the block leaves its field 0.
type ConsumerFeedback struct {
	TimelineSize        uint64    // current_timeline_size
	ReceivedLSN         proto.LSN // ps_writelsn: last received
	DiskConsistentLSN   proto.LSN // ps_flushlsn: durable on the consumer's disk
	RemoteConsistentLSN proto.LSN // ps_applylsn: durable in the consumer's own storage
	ReplyTime           int64     // ps_replytime: µs since 2000-01-01 UTC
}

// Append appends the payload with all five known keys to dst.
func (m *ConsumerFeedback) Append(dst []byte) []byte {
	dst = append(dst, TagConsumerFeedback, 5)
	for _, kv := range [...]struct {
		k string
		v uint64
	}{
		{KeyCurrentTimelineSize, m.TimelineSize},
		{KeyPSWriteLSN, uint64(m.ReceivedLSN)},
		{KeyPSFlushLSN, uint64(m.DiskConsistentLSN)},
		{KeyPSApplyLSN, uint64(m.RemoteConsistentLSN)},
		{KeyPSReplyTime, uint64(m.ReplyTime)},
	} {
		dst = append(dst, kv.k...)
		dst = append(dst, 0)
		dst = binary.BigEndian.AppendUint32(dst, 8)
		dst = binary.BigEndian.AppendUint64(dst, kv.v)
	}
	return dst
}

// ParseConsumerFeedback decodes a 'z' payload (tag included). A truncated
// block, a negative or overlong value length, a known key whose value is not
// 8 bytes, or bytes after the last key are errors: ProtocolViolation *Errors
// wrapping ErrMalformed. A repeated key takes its last value.
func ParseConsumerFeedback(payload []byte) (ConsumerFeedback, error) {
	var m ConsumerFeedback
	if len(payload) < 2 || payload[0] != TagConsumerFeedback {
		return m, malformed("invalid consumer feedback: %d bytes", len(payload))
	}
	nkeys := int(payload[1])
	b := payload[2:]
	for i := 0; i < nkeys; i++ {
		end := bytes.IndexByte(b, 0)
		if end < 0 {
			return ConsumerFeedback{}, malformed("invalid consumer feedback: key %d is not NUL-terminated", i)
		}
		key := string(b[:end])
		b = b[end+1:]
		if len(b) < 4 {
			return ConsumerFeedback{}, malformed("invalid consumer feedback: key %q has no value length", key)
		}
		n := int32(binary.BigEndian.Uint32(b))
		b = b[4:]
		if n < 0 || int64(n) > int64(len(b)) {
			return ConsumerFeedback{}, malformed("invalid consumer feedback: key %q has value length %d, %d bytes left", key, n, len(b))
		}
		val := b[:n]
		b = b[n:]
		switch key {
		case KeyCurrentTimelineSize, KeyPSWriteLSN, KeyPSFlushLSN, KeyPSApplyLSN, KeyPSReplyTime:
		default:
			continue // unknown key: skipped
		}
		if len(val) != 8 {
			return ConsumerFeedback{}, malformed("invalid consumer feedback: key %q has %d bytes, want 8", key, len(val))
		}
		v := binary.BigEndian.Uint64(val)
		switch key {
		case KeyCurrentTimelineSize:
			m.TimelineSize = v
		case KeyPSWriteLSN:
			m.ReceivedLSN = proto.LSN(v)
		case KeyPSFlushLSN:
			m.DiskConsistentLSN = proto.LSN(v)
		case KeyPSApplyLSN:
			m.RemoteConsistentLSN = proto.LSN(v)
		case KeyPSReplyTime:
			m.ReplyTime = int64(v)
		}
	}
	if len(b) != 0 {
		return ConsumerFeedback{}, malformed("invalid consumer feedback: %d trailing bytes", len(b))
	}
	return m, nil
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
