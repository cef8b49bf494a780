package server

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Returning memory after a burst. Go keeps the heap it grew to and gives
// free pages back to the OS only slowly (its background scavenger took
// about five minutes for 3 GB after 1,000 timelines ingested at once), and a
// server that has gone quiet allocates nothing, so no collection comes to
// shrink its heap goal either; and every database page bbolt's mmap touched
// stays counted in the process's resident memory. The reclaimer checks every
// reclaimInterval: once no WAL has arrived for reclaimQuiet checks in a row,
// it releases the database mapping (storage.DB.ReleaseMapped: the pages stay
// in the page cache) and, when more than reclaimThreshold of the heap is
// garbage or free but still held, collects and returns the free memory at
// once (debug.FreeOSMemory). While WAL flows it does nothing: the memory will
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
		{Name: "/memory/classes/heap/objects:bytes"}, // live, and dead not yet swept
		{Name: "/memory/classes/heap/free:bytes"},    // free, not returned to the OS
		{Name: "/gc/heap/live:bytes"},                // live at the last collection
	}
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
		if quiet++; quiet != reclaimQuiet {
			continue // released already in this quiet period, or not yet quiet
		}
		if err := s.db.ReleaseMapped(); err != nil {
			s.log.Warn("could not release the database mapping", "err", err)
		}
		metrics.Read(sample)
		objects, free, live := sample[0].Value.Uint64(), sample[1].Value.Uint64(), sample[2].Value.Uint64()
		if held := free + objects - min(objects, live); held > reclaimThreshold {
			// Twice: the first collection leaves what sync.Pools held
			// (pgwire's recycled bodies) in their victim caches; the second
			// frees it.
			debug.FreeOSMemory()
			debug.FreeOSMemory()
			s.log.Debug("returned free heap memory to the OS after a burst", "bytes", held)
		}
	}
}
