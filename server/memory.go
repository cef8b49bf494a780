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
// shrink its heap goal either. The reclaimer checks every reclaimInterval:
// when no WAL arrived since the last check and more than reclaimThreshold
// of the heap is free but still held, it collects and returns the free
// memory at once (debug.FreeOSMemory). While WAL flows it does nothing: the
// free memory will be used again.
const (
	reclaimInterval  = 5 * time.Second
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
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	last := m.walIn.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		in := m.walIn.Load()
		quiet := in == last
		last = in
		if !quiet {
			continue
		}
		metrics.Read(sample)
		if free := sample[0].Value.Uint64(); free > reclaimThreshold {
			debug.FreeOSMemory()
			s.log.Debug("returned free heap memory to the OS after a burst", "bytes", free)
		}
	}
}
