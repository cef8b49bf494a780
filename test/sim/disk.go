package sim

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// disk is one safekeeper's "disk": the real acceptor.MemStorage (whose
// Crash drops what was never committed, like kill -9) behind a thin
// recorder. The recorder keeps its own copy of what became durable so the
// checker can read WAL ranges after every step without copying the whole
// WAL (MemStorage.Durable copies it); verify compares the copy with
// MemStorage itself, at every restart and at the end of a run.
type disk struct {
	mem *acceptor.MemStorage
	// durable, as recorded
	state acceptor.State
	start proto.LSN
	wal   []byte
	// staged since the last Commit
	staged []diskOp
	// recent are the states durable at some moment since the server last
	// sent replies (the state then, and every commit since): a reply must
	// report one of them (invariant 7).
	recent []acceptor.State
	// full makes every commit fail (and drop what was staged for it), as
	// on a disk with no space left: a fault of the world.
	full bool
}

// errDiskFull is what a full disk's commits fail with.
var errDiskFull = errors.New("sim: no space left on device")

type diskOp struct {
	truncate bool
	lsn      proto.LSN
	data     []byte
}

var _ acceptor.Storage = (*disk)(nil)

func newDisk(st acceptor.State) *disk {
	return &disk{mem: acceptor.NewMemStorage(st), state: st.Clone(), start: st.TimelineStartLSN, recent: []acceptor.State{st.Clone()}}
}

// settle forgets the recent states but the current one: the server sent
// what it had to send.
func (d *disk) settle() { d.recent = append(d.recent[:0], d.state) }

func (d *disk) WriteWAL(lsn proto.LSN, data []byte) error {
	if err := d.mem.WriteWAL(lsn, data); err != nil {
		return err
	}
	d.staged = append(d.staged, diskOp{lsn: lsn, data: append([]byte(nil), data...)})
	return nil
}

func (d *disk) TruncateWAL(lsn proto.LSN) error {
	if err := d.mem.TruncateWAL(lsn); err != nil {
		return err
	}
	d.staged = append(d.staged, diskOp{truncate: true, lsn: lsn})
	return nil
}

func (d *disk) Commit(s acceptor.State) error {
	if d.full {
		d.mem.FailCommit = errDiskFull
	}
	if err := d.mem.Commit(s); err != nil {
		d.staged = nil
		return err
	}
	for _, op := range d.staged {
		end := d.start + proto.LSN(len(d.wal))
		switch {
		case op.truncate:
			if op.lsn < d.start || len(d.wal) == 0 {
				d.start, d.wal = op.lsn, nil
			} else if op.lsn < end {
				d.wal = d.wal[:op.lsn-d.start]
			}
		case len(d.wal) == 0:
			d.start, d.wal = op.lsn, append([]byte(nil), op.data...)
		default:
			d.wal = append(d.wal, op.data...) // MemStorage checked contiguity
		}
	}
	d.staged = nil
	d.state = s.Clone()
	d.recent = append(d.recent, d.state)
	return nil
}

// Load returns the durable state.
func (d *disk) Load() (acceptor.State, error) { return d.mem.Load() }

// crash is kill -9: everything staged is lost.
func (d *disk) crash() {
	d.mem.Crash()
	d.staged = nil
}

// bytes returns the durable WAL [from, to), or nil if the disk does not hold
// all of it. The slice aliases the disk.
func (d *disk) bytes(from, to proto.LSN) []byte {
	if from < d.start || to > d.start+proto.LSN(len(d.wal)) || from > to {
		return nil
	}
	return d.wal[from-d.start : to-d.start]
}

// verify checks the recorder against MemStorage and returns the durable
// state.
func (d *disk) verify() (acceptor.State, error) {
	st, start, wal := d.mem.Durable()
	if !reflect.DeepEqual(st, d.state) {
		return st, fmt.Errorf("disk recorder: state %+v, MemStorage has %+v", d.state, st)
	}
	if len(wal) != 0 && start != d.start || !bytes.Equal(wal, d.wal) {
		return st, fmt.Errorf("disk recorder: WAL %s+%d, MemStorage has %s+%d", d.start, len(d.wal), start, len(wal))
	}
	return st, nil
}
