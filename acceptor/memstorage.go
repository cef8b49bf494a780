package acceptor

import (
	"fmt"
	"sync"

	"github.com/safekeeper/safekeeper/proto"
)

// MemStorage is an in-memory Storage with the same crash semantics as the
// bbolt one: staged writes and truncations become durable only at Commit,
// and Crash forgets everything staged. It is for tests and the simulation.
type MemStorage struct {
	mu sync.Mutex
	// durable
	state   State
	start   proto.LSN // LSN of wal[0]
	wal     []byte
	commits int
	// staged, in order
	staged []memOp
	// FailCommit, when set, is returned by the next Commit (and cleared).
	FailCommit error
}

type memOp struct {
	truncate bool
	lsn      proto.LSN
	data     []byte
}

var _ Storage = (*MemStorage)(nil)

// NewMemStorage returns a storage whose durable state is st and whose WAL
// starts at st.TimelineStartLSN (or at the first write).
func NewMemStorage(st State) *MemStorage {
	return &MemStorage{state: st.Clone(), start: st.TimelineStartLSN}
}

func (m *MemStorage) WriteWAL(lsn proto.LSN, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staged = append(m.staged, memOp{lsn: lsn, data: append([]byte(nil), data...)})
	return nil
}

func (m *MemStorage) TruncateWAL(lsn proto.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staged = append(m.staged, memOp{truncate: true, lsn: lsn})
	return nil
}

func (m *MemStorage) Commit(s State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.FailCommit; err != nil {
		m.FailCommit = nil
		m.staged = nil
		return err
	}
	for _, op := range m.staged {
		end := m.start + proto.LSN(len(m.wal))
		switch {
		case op.truncate:
			if op.lsn < m.start || len(m.wal) == 0 {
				m.start, m.wal = op.lsn, nil
			} else if op.lsn < end {
				m.wal = m.wal[:op.lsn-m.start]
			}
		case len(m.wal) == 0:
			m.start, m.wal = op.lsn, append([]byte(nil), op.data...)
		case op.lsn == end:
			m.wal = append(m.wal, op.data...)
		default:
			panic(fmt.Sprintf("acceptor.MemStorage: non-contiguous write at %s, WAL ends at %s", op.lsn, end))
		}
	}
	m.staged = nil
	m.state = s.Clone()
	m.commits++
	return nil
}

// Load returns the durable state.
func (m *MemStorage) Load() (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.Clone(), nil
}

// Crash drops everything staged, as a kill -9 would.
func (m *MemStorage) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staged = nil
}

// Durable returns the durable state and a copy of the durable WAL with the
// LSN of its first byte.
func (m *MemStorage) Durable() (State, proto.LSN, []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.Clone(), m.start, append([]byte(nil), m.wal...)
}

// Commits counts successful Commit calls.
func (m *MemStorage) Commits() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits
}
