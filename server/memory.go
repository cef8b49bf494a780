package server

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// Returning memory after a burst. Go keeps the heap it grew to and gives
// free pages back to the OS only slowly (its background scavenger took
// about five minutes for 3 GB after 1,000 timelines ingested at once), and a
// server that has gone quiet allocates nothing, so no collection comes to
// shrink its heap goal either; and every database page bbolt's mmap touched
// stays counted in the process's resident memory. The reclaimer checks every
// reclaimInterval: once no WAL has arrived for reclaimQuiet checks in a row,
// it releases the database mapping (storage.DB.ReleaseMapped: the pages stay
// in the page cache) and pgwire's free body buffers, and at that check and every later one while it stays
// quiet, when the heap holds more than reclaimThreshold beyond what was live
// after the last reclaim, it collects and returns the free memory at once
// (debug.FreeOSMemory). While WAL flows it does nothing: the memory will
// be used again.
const (
	reclaimInterval  = time.Second
	reclaimQuiet     = 2
	reclaimThreshold = 64 << 20
)

// reclaimer watches walIn (WAL bytes received, counted by the push
// readers) and the heap.
type reclaimer struct {
	walIn atomic.Int64
}

func (m *reclaimer) run(ctx context.Context, s *Server) {
	t := time.NewTicker(reclaimInterval)
	defer t.Stop()
	sample := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"}, // live, and dead not yet collected
		{Name: "/memory/classes/heap/free:bytes"},    // free, not returned to the OS
	}
	heldNow := func() (objects, free uint64) {
		metrics.Read(sample)
		return sample[0].Value.Uint64(), sample[1].Value.Uint64()
	}
	// base is the heap's objects right after the last reclaim: what a
	// quiet server holds live. Growth above it since then is the garbage
	// of what came after (a burst, connections that closed), which only a
	// collection can tell from live memory.
	var base uint64
	last, quiet := m.walIn.Load(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		in := m.walIn.Load()
		if in != last {
			last, quiet = in, 0
			continue
		}
		if quiet++; quiet < reclaimQuiet {
			continue
		}
		if quiet == reclaimQuiet { // once per quiet period: readers may map pages again
			if err := s.db.ReleaseMapped(); err != nil {
				s.log.Warn("could not release the database mapping", "err", err)
			}
		}
		// Every check while quiet: connections that close later free their
		// memory later. A quiet server allocates little, so once its memory
		// is returned this stays below the threshold.
		if quiet == reclaimQuiet {
			base = 0 // the first check of a quiet period judges all the heap
			pgwire.DropRecycled()
		}
		objects, free := heldNow()
		if held := objects + free - min(base, objects); held > reclaimThreshold {
			debug.FreeOSMemory()
			base, _ = heldNow()
			s.log.Debug("returned free heap memory to the OS", "held", held, "live", base)
		}
	}
}
