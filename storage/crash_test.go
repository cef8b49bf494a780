package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// The crash test re-executes the test binary as TestHelperProcess, which
// commits WAL writes and truncations in a loop and reports on stdout, one
// line per write(2) (atomic on a pipe), what it is about to commit and what
// Commit acknowledged:
//
//	R                          ready (DB open, main timeline exists)
//	P <seq> <op> <op> ...      about to Commit seq; op = T<lsn> | W<lsn>:<len>
//	C <seq>                    Commit(seq) returned nil: durable
//	K <tenant>/<timeline>      CreateTimeline and its WAL's Commit returned nil
//	D <tenant>/<timeline>      about to DeleteTimeline
//	X <tenant>/<timeline>      DeleteTimeline returned nil
//
// W data is walData(lsn, len, seq). The control state committed with seq has
// VotedFor.Term = seq and FlushLSN = the end of WAL after seq's ops.
const (
	crashDirEnv  = "STORAGE_CRASH_HELPER_DIR"
	crashSeedEnv = "STORAGE_CRASH_HELPER_SEED"
	crashStart   = proto.LSN(testSegSize + 0x28)
	crashMaxWAL  = 6 << 20
)

func crashMainState() acceptor.State { return testState(0xC0) }

func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("helper process of TestCrashKill")
	}
	seed, err := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashHelper(filepath.Join(dir, "safekeeper.db"), seed); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(3)
	}
}

func crashHelper(path string, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xC4A5))
	db, err := Open(path, Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	st := crashMainState()
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	switch {
	case errors.Is(err, ErrNoTimeline):
		if tl, err = db.CreateTimeline(st); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		st = got
	}
	say := func(format string, args ...any) {
		// One write per line: the parent never sees half a line.
		if _, err := os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n"); err != nil {
			os.Exit(4)
		}
	}
	// The timelines a delete may take: those earlier runs created too, so
	// that a run killed after few commits still deletes (a run that only
	// deleted its own creations deleted none on a loaded machine).
	var others []proto.TimelineKey
	keys, err := db.Timelines()
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k != (proto.TimelineKey{TenantID: st.TenantID, TimelineID: st.TimelineID}) {
			others = append(others, k)
		}
	}
	say("R")
	end := tl.EndLSN()
	if end == 0 {
		end = crashStart
	}
	for seq := st.VotedFor.Term + 1; ; seq++ {
		var ops []string
		if rng.IntN(4) == 0 || end-crashStart > crashMaxWAL {
			lim := end - crashStart
			if lim > crashMaxWAL {
				lim = crashMaxWAL / 2
			}
			lsn := crashStart + proto.LSN(rng.Int64N(int64(lim)+1))
			if err := tl.TruncateWAL(lsn); err != nil {
				return err
			}
			ops = append(ops, fmt.Sprintf("T%d", lsn))
			end = lsn
		}
		for range rng.IntN(4) {
			n := 1 + rng.IntN(300_000)
			if err := tl.WriteWAL(end, walData(end, n, seq)); err != nil {
				return err
			}
			ops = append(ops, fmt.Sprintf("W%d:%d", end, n))
			end += proto.LSN(n)
		}
		st.VotedFor.Term = seq
		st.FlushLSN = end
		say("P %d %s", seq, strings.Join(ops, " "))
		if err := tl.Commit(st); err != nil {
			return err
		}
		say("C %d", seq)
		if rng.IntN(4) == 0 {
			other := testState(rng.IntN(1 << 16))
			other.TimelineID[1] = byte(seq)
			other.TimelineID[2] = byte(seq >> 8)
			otl, err := db.CreateTimeline(other)
			if errors.Is(err, ErrTimelineExists) {
				continue
			}
			if err != nil {
				return err
			}
			// Some WAL, a few segments, so that a delete has extents to
			// free.
			n := testSegSize/2 + rng.IntN(3*testSegSize)
			if err := otl.WriteWAL(otherStart, walData(otherStart, n, otherGen)); err != nil {
				return err
			}
			other.TimelineStartLSN, other.FlushLSN = otherStart, otherStart+proto.LSN(n)
			if err := otl.Commit(other); err != nil {
				return err
			}
			key := proto.TimelineKey{TenantID: other.TenantID, TimelineID: other.TimelineID}
			others = append(others, key)
			say("K %s", key)
		}
		if len(others) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(others))
			key := others[i]
			others = append(others[:i], others[i+1:]...)
			say("D %s", key)
			if err := db.DeleteTimeline(key.TenantID, key.TimelineID); err != nil {
				return err
			}
			say("X %s", key)
		}
	}
}

// The other timelines' WAL: walData(otherStart, n, otherGen), from their
// first byte to their flush_lsn.
const (
	otherStart = proto.LSN(testSegSize)
	otherGen   = 7
)

// crashModel is what the parent knows is durable.
type crashModel struct {
	seq       uint64          // last acknowledged commit
	wal       []byte          // WAL from crashStart as of seq
	timelines map[string]bool // created and not deleted
	deleted   map[string]bool // deleted and not created again
	deleting  string          // a delete announced and not acknowledged
	deletes   int             // deletes acknowledged
}

func (m *crashModel) apply(ops []string, seq uint64) error {
	for _, op := range ops {
		switch op[0] {
		case 'T':
			lsn, err := strconv.ParseUint(op[1:], 10, 64)
			if err != nil {
				return err
			}
			m.wal = m.wal[:proto.LSN(lsn)-crashStart]
		case 'W':
			l, n, ok := strings.Cut(op[1:], ":")
			lsn, err1 := strconv.ParseUint(l, 10, 64)
			size, err2 := strconv.Atoi(n)
			if !ok || err1 != nil || err2 != nil || proto.LSN(lsn) != crashStart+proto.LSN(len(m.wal)) {
				return fmt.Errorf("bad write op %q", op)
			}
			m.wal = append(m.wal, walData(proto.LSN(lsn), size, seq)...)
		default:
			return fmt.Errorf("bad op %q", op)
		}
	}
	return nil
}

// TestCrashKill SIGKILLs a process that is committing to a real bbolt file
// at random moments, then checks on the same file that every acknowledged
// commit is there, that nothing above a committed truncation can be read, and
// that control states decode. Set STORAGE_CRASH_SEED to replay a run.
func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STORAGE_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (rerun with STORAGE_CRASH_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	path := filepath.Join(dir, "safekeeper.db")
	model := &crashModel{timelines: map[string]bool{}, deleted: map[string]bool{}}

	const budget = 12 * time.Second
	began := time.Now()
	var iterations, inFlightSeen, wantCommits uint64
	deletesCut := 0 // kills during a DeleteTimeline
	for iterations < 40 && (iterations < 5 || time.Since(began) < budget) {
		iterations++
		childSeed := rng.Uint64()
		// The kill is armed once the child has acknowledged killAfter
		// commits in this run, then fires after a random delay: every run
		// makes progress however slow the machine is, and the kill still
		// lands at a random point of a commit.
		killAfter := uint64(rng.IntN(4))
		wantCommits += killAfter
		delay := time.Duration(rng.Int64N(int64(30 * time.Millisecond)))
		acked, pending, err := runCrashChild(dir, childSeed, killAfter, delay, model)
		if err != nil {
			t.Fatalf("seed %d, iteration %d: %v", seed, iterations, err)
		}
		adopted, err := checkCrashDB(path, model, pending)
		if err != nil {
			t.Fatalf("seed %d, iteration %d (kill %v after ready, %d commits acknowledged in this run): %v", seed, iterations, delay, acked, err)
		}
		if adopted {
			inFlightSeen++
		}
		if model.deleting != "" {
			deletesCut++
			model.deleting = ""
		}
	}
	t.Logf("%d kills, last commit seq %d, %d times the in-flight commit had become durable; %d deletes acknowledged, %d cut by the kill",
		iterations, model.seq, inFlightSeen, model.deletes, deletesCut)
	if model.deletes == 0 {
		t.Fatal("no DeleteTimeline was acknowledged: the delete path was not tested")
	}
	if model.seq < wantCommits {
		t.Fatalf("only %d commits over %d runs, want at least %d: the helper is not making progress", model.seq, iterations, wantCommits)
	}
}

// runCrashChild runs the helper until it is killed delay after it is ready
// and has acknowledged killAfter commits.
// It applies acknowledged commits and creations to model and returns the
// number of new acknowledged commits and the ops of the commit in flight
// (nil if none was announced).
func runCrashChild(dir string, seed, killAfter uint64, delay time.Duration, model *crashModel) (acked uint64, pending *pendingCommit, err error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashSeedEnv+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	r := bufio.NewReader(out)
	var parseErr error
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // EOF after the kill; a torn last line is ignored
		}
		if parseErr != nil {
			continue // keep draining so the child is not blocked on the pipe
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == "R":
			if killAfter == 0 {
				timer = time.AfterFunc(delay, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
			}
		case len(f) >= 2 && f[0] == "P":
			seq, _ := strconv.ParseUint(f[1], 10, 64)
			if seq != model.seq+1 {
				parseErr = fmt.Errorf("helper announced commit %d after %d", seq, model.seq)
			}
			pending = &pendingCommit{seq: seq, ops: f[2:]}
		case len(f) == 2 && f[0] == "C":
			seq, _ := strconv.ParseUint(f[1], 10, 64)
			if pending == nil || pending.seq != seq {
				parseErr = fmt.Errorf("helper acknowledged commit %d without announcing it", seq)
				continue
			}
			if parseErr = model.apply(pending.ops, seq); parseErr == nil {
				model.seq = seq
				acked++
				if acked == killAfter && timer == nil {
					timer = time.AfterFunc(delay, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
				}
			}
			pending = nil
		case len(f) == 2 && f[0] == "K":
			model.timelines[f[1]] = true
			delete(model.deleted, f[1])
		case len(f) == 2 && f[0] == "D":
			// In flight: either state is allowed until X.
			delete(model.timelines, f[1])
			model.deleting = f[1]
		case len(f) == 2 && f[0] == "X":
			model.deleted[f[1]] = true
			model.deleting = ""
			model.deletes++
		default:
			parseErr = fmt.Errorf("unexpected helper output %q", line)
		}
	}
	_, _ = io.Copy(io.Discard, out)
	werr := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		return 0, nil, fmt.Errorf("helper did not die by SIGKILL: %v\nstderr:\n%s", werr, stderr.Bytes())
	}
	return acked, pending, parseErr
}

type pendingCommit struct {
	seq uint64
	ops []string
}

// checkCrashDB opens the DB left by a killed helper and checks it against
// model: the state is the last acknowledged commit or, if announced, the one
// in flight, and the WAL is exactly the model's WAL for that commit. On
// success model is advanced to what is on disk; adopted reports that the
// commit in flight had become durable.
func checkCrashDB(path string, model *crashModel, pending *pendingCommit) (adopted bool, err error) {
	db, err := Open(path, Options{})
	if err != nil {
		return false, err
	}
	defer db.Close()
	main := crashMainState()
	tl, st, err := db.OpenTimeline(main.TenantID, main.TimelineID)
	if err != nil {
		return false, fmt.Errorf("main timeline: %w", err)
	}
	switch {
	case st.VotedFor.Term == model.seq:
	case pending != nil && st.VotedFor.Term == pending.seq:
		// The commit in flight became durable before the kill: adopt it.
		if err := model.apply(pending.ops, pending.seq); err != nil {
			return false, err
		}
		model.seq = pending.seq
		adopted = true
	default:
		return false, fmt.Errorf("durable state is commit %d; acknowledged %d, in flight %v", st.VotedFor.Term, model.seq, pending)
	}
	end := crashStart + proto.LSN(len(model.wal))
	if st.FlushLSN != end && model.seq > 0 {
		return false, fmt.Errorf("commit %d: state flush_lsn %s, model WAL ends at %s", model.seq, st.FlushLSN, end)
	}
	if got := tl.EndLSN(); got != end && !(got == 0 && end == crashStart) {
		return false, fmt.Errorf("commit %d: EndLSN %s, want %s (WAL above a committed truncation or a lost write)", model.seq, got, end)
	}
	buf := make([]byte, 1<<20)
	for lsn := crashStart; lsn < end; {
		n, err := tl.ReadWAL(lsn, buf[:min(len(buf), int(end-lsn))])
		if err != nil {
			return false, fmt.Errorf("commit %d: ReadWAL(%s): %w", model.seq, lsn, err)
		}
		off := lsn - crashStart
		if n == 0 || !bytes.Equal(buf[:n], model.wal[off:off+proto.LSN(n)]) {
			return false, fmt.Errorf("commit %d: WAL at %s differs from the acknowledged WAL (%d bytes read)", model.seq, lsn, n)
		}
		lsn += proto.LSN(n)
	}
	if n, err := tl.ReadWAL(end, buf); n != 0 || err != nil {
		return false, fmt.Errorf("commit %d: %d bytes readable above the end %s (err %v)", model.seq, n, end, err)
	}
	keys, err := db.Timelines()
	if err != nil {
		return false, err
	}
	listed := map[string]bool{}
	for _, k := range keys {
		listed[k.String()] = true
		otl, ost, err := db.OpenTimeline(k.TenantID, k.TimelineID)
		if err != nil {
			return false, fmt.Errorf("timeline %s is listed but does not open: %w", k, err)
		}
		if k == (proto.TimelineKey{TenantID: main.TenantID, TimelineID: main.TimelineID}) {
			continue
		}
		if model.deleted[k.String()] {
			return false, fmt.Errorf("timeline %s was deleted (acknowledged) but is still stored", k)
		}
		// Whole: all of its committed WAL reads back (a torn delete would
		// leave extents missing under a control record, or the reverse).
		oend := otl.EndLSN()
		if ost.FlushLSN != oend && !(oend == 0 && ost.FlushLSN == 0) {
			return false, fmt.Errorf("timeline %s: flush_lsn %s but WAL ends at %s", k, ost.FlushLSN, oend)
		}
		for lsn := otherStart; lsn < oend; {
			n, err := otl.ReadWAL(lsn, buf[:min(len(buf), int(oend-lsn))])
			if err != nil || n == 0 || !bytes.Equal(buf[:n], walData(lsn, n, otherGen)) {
				return false, fmt.Errorf("timeline %s: WAL at %s is not whole (%d bytes, err %v)", k, lsn, n, err)
			}
			lsn += proto.LSN(n)
		}
	}
	for k := range model.timelines {
		if !listed[k] {
			return false, fmt.Errorf("acknowledged timeline %s is missing", k)
		}
	}
	return adopted, nil
}
