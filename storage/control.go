package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// controlMagic opens every encoded control record: "SKCS" (safekeeper
// control state).
var controlMagic = [4]byte{'S', 'K', 'C', 'S'}

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

// castagnoli is the CRC-32C table (the polynomial PostgreSQL uses for WAL).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeState appends the control record of s to dst. Layout (big-endian):
//
//	magic "SKCS" | version u32 | tenant_id [16] | timeline_id [16] |
//	system_id u64 | pg_version u32 | wal_seg_size u32 | pg_timeline u32 |
//	voted_for.term u64 | voted_for.uuid [16] | timeline_start_lsn u64 |
//	flush_lsn u64 | commit_lsn u64 | truncate_lsn u64 | removed_up_to u64 |
//	n u32 | n × (term u64, start_lsn u64) | crc32c u32
//
// The CRC-32C covers every byte before it.
func encodeState(dst []byte, s *acceptor.State) []byte {
	start := len(dst)
	dst = append(dst, controlMagic[:]...)
	dst = binary.BigEndian.AppendUint32(dst, controlVersion)
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
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// decodeState parses a control record written by encodeState. Every error
// wraps ErrCorrupt. The result shares no memory with src.
func decodeState(src []byte) (acceptor.State, error) {
	var s acceptor.State
	if len(src) < controlFixedLen {
		return s, fmt.Errorf("%w: control record truncated: %d bytes, need at least %d", ErrCorrupt, len(src), controlFixedLen)
	}
	if [4]byte(src[:4]) != controlMagic {
		return s, fmt.Errorf("%w: control record has bad magic %q", ErrCorrupt, src[:4])
	}
	if v := binary.BigEndian.Uint32(src[4:]); v != controlVersion {
		return s, fmt.Errorf("%w: control record version %d, this build reads version %d", ErrCorrupt, v, controlVersion)
	}
	body, sum := src[:len(src)-4], binary.BigEndian.Uint32(src[len(src)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return s, fmt.Errorf("%w: control record CRC-32C mismatch: stored %08x, computed %08x", ErrCorrupt, sum, got)
	}
	p := body[8:]
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
		return acceptor.State{}, fmt.Errorf("%w: control record holds %d bytes of term history, %d entries need %d", ErrCorrupt, len(p), n, uint64(n)*historyEntryLen)
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
