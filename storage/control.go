package storage

import (
	"encoding/binary"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// controlRecord is the framing of the control record: magic "SKCS"
// (safekeeper control state), version controlVersion, and a body of at least
// the fixed fields; the term history makes it variable.
var controlRecord = recordKind{
	name:     "control record",
	magic:    [4]byte{'S', 'K', 'C', 'S'},
	version:  controlVersion,
	bodyLen:  controlFixedLen - recordOverhead,
	variable: true,
}

// controlVersion is the version of the control record layout below. A
// decoder refuses any other version rather than guess.
const controlVersion = 1

// controlFixedLen is the length of a control record with an empty history:
// magic 4, version 4, tenant_id 16, timeline_id 16, system_id 8, pg_version 4,
// wal_seg_size 4, pg_timeline 4, voted_for 8+16, timeline_start_lsn 8,
// flush_lsn 8, commit_lsn 8, truncate_lsn 8, removed_up_to 8, history count 4,
// crc 4.
const controlFixedLen = 4 + 4 + 16 + 16 + 8 + 4 + 4 + 4 + 24 + 5*8 + 4 + 4

// historyEntryLen is the length of one encoded term switch.
const historyEntryLen = 16

// encodeState appends the control record of s to dst. Layout (big-endian):
//
//	magic "SKCS" | version u32 | tenant_id [16] | timeline_id [16] |
//	system_id u64 | pg_version u32 | wal_seg_size u32 | pg_timeline u32 |
//	voted_for.term u64 | voted_for.uuid [16] | timeline_start_lsn u64 |
//	flush_lsn u64 | commit_lsn u64 | truncate_lsn u64 | removed_up_to u64 |
//	n u32 | n × (term u64, start_lsn u64) | crc32c u32
//
// The CRC-32C covers every byte before it. controlRecord writes the magic,
// the version and the CRC; this is the body.
func encodeState(dst []byte, s *acceptor.State) []byte {
	return controlRecord.append(dst, func(dst []byte) []byte {
		dst = append(dst, s.TenantID[:]...)
		dst = append(dst, s.TimelineID[:]...)
		dst = binary.BigEndian.AppendUint64(dst, s.SystemID)
		dst = binary.BigEndian.AppendUint32(dst, s.PgVersion)
		dst = binary.BigEndian.AppendUint32(dst, s.WalSegSize)
		dst = binary.BigEndian.AppendUint32(dst, s.PgTimeline)
		dst = binary.BigEndian.AppendUint64(dst, s.VotedFor.Term)
		dst = append(dst, s.VotedFor.UUID[:]...)
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.TimelineStartLSN))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.FlushLSN))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.CommitLSN))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.TruncateLSN))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.RemovedUpTo))
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(s.History)))
		for _, e := range s.History {
			dst = binary.BigEndian.AppendUint64(dst, e.Term)
			dst = binary.BigEndian.AppendUint64(dst, uint64(e.StartLSN))
		}
		return dst
	})
}

// decodeState parses a control record written by encodeState. Every error
// wraps ErrCorrupt. The result shares no memory with src.
func decodeState(src []byte) (acceptor.State, error) {
	var s acceptor.State
	p, err := controlRecord.open(src)
	if err != nil {
		return s, err
	}
	u64 := func() uint64 { v := binary.BigEndian.Uint64(p); p = p[8:]; return v }
	u32 := func() uint32 { v := binary.BigEndian.Uint32(p); p = p[4:]; return v }
	id := func() (v proto.ID) { copy(v[:], p); p = p[16:]; return v }

	s.TenantID = id()
	s.TimelineID = id()
	s.SystemID = u64()
	s.PgVersion = u32()
	s.WalSegSize = u32()
	s.PgTimeline = u32()
	s.VotedFor.Term = u64()
	s.VotedFor.UUID = id()
	s.TimelineStartLSN = proto.LSN(u64())
	s.FlushLSN = proto.LSN(u64())
	s.CommitLSN = proto.LSN(u64())
	s.TruncateLSN = proto.LSN(u64())
	s.RemovedUpTo = proto.LSN(u64())
	n := u32()
	if uint64(len(p)) != uint64(n)*historyEntryLen {
		return acceptor.State{}, controlRecord.corrupt("holds %d bytes of term history, %d entries need %d", len(p), n, uint64(n)*historyEntryLen)
	}
	if n > 0 {
		s.History = make(proto.TermHistory, n)
		for i := range s.History {
			s.History[i].Term = u64()
			s.History[i].StartLSN = proto.LSN(u64())
		}
	}
	return s, nil
}
