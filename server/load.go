package server

// Load is what a safekeeper reports of its load to a fleet (its
// registration in etcd, package fleet): the timelines it stores and may
// store, and its data directory's file system, as the disk breaker last
// read it (free counts the free pages inside the database file).
type Load struct {
	Timelines, MaxTimelines int
	DiskFree, DiskTotal     uint64
}

// Load reads the server's load.
func (s *Server) Load() Load {
	n := 0
	if keys, err := s.reg.Keys(); err == nil {
		n = len(keys)
	}
	return Load{Timelines: n, MaxTimelines: s.cfg.MaxTimelines, DiskFree: s.disk.free.Load(), DiskTotal: s.disk.total.Load()}
}
