package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestWALMatchesModel drives one timeline through random writes (tiny ones
// that bbolt stores as inline extents, large ones crossing segments),
// truncations (at extent starts, chunk starts, mid-chunk, below the first
// byte), retention and reopens, and after every Commit checks every byte
// ReadWAL returns, the WAL range and the extent layout against a plain
// byte-slice model.
func TestWALMatchesModel(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { walModelRun(t, seed) })
	}
}

func walModelRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	path := testPath(t)
	opts := Options{MaxChunkSize: 40_000}
	db := openTest(t, path, opts)
	st := testState(1)
	start := proto.LSN(2*testSegSize + 0x28)
	st.TimelineStartLSN = start
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	// The model: WAL [first, first+len(model)).
	first, model := start, []byte(nil)
	end := func() proto.LSN { return first + proto.LSN(len(model)) }
	var gen uint64
	var commitStarts []proto.LSN
	var kept [][]byte

	for step := range 150 {
		for range 1 + rng.IntN(3) {
			switch r := rng.IntN(10); {
			case r < 7:
				var n int
				switch rng.IntN(3) {
				case 0:
					n = 1 + rng.IntN(300) // an inline extent
				case 1:
					n = 1 + rng.IntN(20_000)
				default:
					n = 1 + rng.IntN(300_000)
				}
				gen++
				data := walData(end(), n, gen)
				if err := tl.WriteWAL(end(), data); err != nil {
					t.Fatalf("step %d: WriteWAL: %v", step, err)
				}
				if n < keepWALWrite {
					clear(data) // WriteWAL copied it
				} else {
					kept = append(kept, data) // kept until Commit returns
				}
				model = append(model, walData(end(), n, gen)...)
			case len(model) > 0:
				// Truncate at an earlier commit's start, or anywhere.
				at := first + proto.LSN(rng.IntN(len(model)))
				if len(commitStarts) > 0 && rng.IntN(2) == 0 {
					at = max(first, min(end(), commitStarts[rng.IntN(len(commitStarts))]))
				}
				if err := tl.TruncateWAL(at); err != nil {
					t.Fatal(err)
				}
				model = model[:at-first]
			}
		}
		commitStarts = append(commitStarts, end())
		st.FlushLSN = end()
		if err := tl.Commit(st); err != nil {
			t.Fatalf("step %d: Commit: %v", step, err)
		}
		for _, d := range kept {
			clear(d) // the caller's again once Commit returned
		}
		kept = kept[:0]
		if rng.IntN(10) == 0 && end().SegmentStart(testSegSize) > first {
			cut := end().SegmentStart(testSegSize)
			if err := tl.RemoveWAL(cut); err != nil {
				t.Fatalf("step %d: RemoveWAL(%s): %v", step, cut, err)
			}
			if cut > first {
				model = model[cut-first:]
				first = cut
			}
		}
		if rng.IntN(15) == 0 {
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openTest(t, path, opts)
			if tl, _, err = db.OpenTimeline(st.TenantID, st.TimelineID); err != nil {
				t.Fatal(err)
			}
		}
		checkWALModel(t, db, tl, first, model, rng)
	}
}

func checkWALModel(t *testing.T, db *DB, tl *Timeline, first proto.LSN, model []byte, rng *rand.Rand) {
	t.Helper()
	end := first + proto.LSN(len(model))
	if len(model) > 0 {
		assertEnd(t, tl, end)
	}
	starts, lens := chunks(t, db, tl)
	next := first
	for i, s := range starts {
		if s != next || lens[i] == 0 || lens[i] > 40_000 {
			t.Fatalf("chunk %d: %s+%d, want start %s and 1..40000 bytes", i, s, lens[i], next)
		}
		next += proto.LSN(lens[i])
	}
	if len(model) > 0 && next != end {
		t.Fatalf("chunks end at %s, want %s", next, end)
	}
	if len(model) == 0 {
		return
	}
	if got := readAll(t, tl, first, end, 1<<20); !bytes.Equal(got, model) {
		t.Fatal("WAL read back differs from the model")
	}
	buf := make([]byte, 1+rng.IntN(70_000))
	for range 20 {
		from := first + proto.LSN(rng.IntN(len(model)))
		n, err := tl.ReadWAL(from, buf)
		if err != nil {
			t.Fatalf("ReadWAL(%s): %v", from, err)
		}
		if want := min(len(buf), int(end-from)); n != want || !bytes.Equal(buf[:n], model[from-first:from-first+proto.LSN(n)]) {
			t.Fatalf("ReadWAL(%s) = %d bytes, want %d matching the model", from, n, want)
		}
	}
	if first > 0 {
		if _, err := tl.ReadWAL(first-1, buf); !errors.Is(err, ErrWALRemoved) {
			t.Fatalf("ReadWAL below the first byte %s: %v, want ErrWALRemoved", first, err)
		}
	}
}

// TestCommitWritesEachChunkOnce: a Commit writes its own WAL and a few
// pages of tree above it, and does not rewrite the WAL of the commits before
// it. Counted in pages (bbolt's own counter of the dirty pages it writes),
// not time: with chunks straight under one bucket, each 16 KiB commit wrote
// 29 pages (the three or four chunks before it again), now 11: five for its
// chunk, one each for the leaf of extents, the branch above it, the
// timeline's and the timelines' buckets, the root and the meta page.
func TestCommitWritesEachChunkOnce(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	st.WalSegSize = 16 << 20
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const size, commits = 16 << 10, 300
	lsn := proto.LSN(16 << 20)
	data := walData(lsn, size, 1)
	before := db.counters()
	for range commits {
		if err := tl.WriteWAL(lsn, data); err != nil {
			t.Fatal(err)
		}
		lsn += size
		st.FlushLSN = lsn
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
	}
	after := db.counters()
	pageSize := int64(db.bolt.Info().PageSize)
	pages := float64((after.pageAlloc-before.pageAlloc)/pageSize+commits) / commits
	if pages > 12 {
		t.Fatalf("%.1f pages written per %d-byte commit, want at most 12", pages, size)
	}
	t.Logf("%.2f pages per %d-byte commit (%.2f bytes written per WAL byte)", pages, size, pages*float64(pageSize)/size)
}
