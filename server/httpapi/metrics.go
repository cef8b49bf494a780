package httpapi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage"
)

// The metrics /metrics serves: the server-wide instruments (Metrics,
// updated where things happen: the group commit, the owners, the
// refusals) and, at scrape time, the gauges of every running timeline and
// of the process (timelineCollector). Names are Neon's where it has one;
// labels tenant_id/timeline_id only on per-timeline gauges.

// Metrics are the server-wide instruments (bounded cardinality: no
// per-timeline histograms). The server makes them before it opens the
// database (ObserveCommit is storage's OnCommit), hands the timelines
// theirs (Timelines) and counts refusals (Refused); New registers them.
type Metrics struct {
	writeSeconds prometheus.Histogram // one group commit: WAL into the store's pages
	flushSeconds prometheus.Histogram // one group commit: written to the file and fsynced
	slowFsyncs   prometheus.Counter
	writeBytes   prometheus.Histogram // WAL bytes per SafeKeeperRequest
	appends      prometheus.Counter
	received     prometheus.Counter
	slowFsync    time.Duration // a commit longer than this is counted in slowFsyncs
	refused      *prometheus.CounterVec
}

// ObserveCommit is storage's OnCommit.
func (m *Metrics) ObserveCommit(c storage.CommitStats) {
	if c.Err != nil || c.WALBytes == 0 {
		return // a commit of control state only: no WAL written
	}
	m.writeSeconds.Observe(c.Apply.Seconds())
	m.flushSeconds.Observe(c.Write.Seconds())
	if c.Apply+c.Write > m.slowFsync {
		m.slowFsyncs.Inc()
	}
}

// Timelines are the instruments the timelines update.
func (m *Metrics) Timelines() *timeline.Metrics {
	return &timeline.Metrics{WriteBytes: m.writeBytes, Appends: m.appends, Received: m.received, Refused: m.refused}
}

// Refused counts a refusal by a resource limit (safekeeper_refused_total).
func (m *Metrics) Refused(reason string) { m.refused.WithLabelValues(reason).Inc() }

// NewMetrics makes the instruments; a group commit longer than slowFsync
// counts in safekeeper_slow_fsyncs_total.
func NewMetrics(slowFsync time.Duration) *Metrics {
	return &Metrics{
		slowFsync: slowFsync,
		refused:   newRefusedCounter(),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_write_wal_seconds",
			Help: "Time of one group commit spent putting WAL and state into the store's pages (in memory), before the disk writes.", Buckets: prometheus.ExponentialBuckets(0.00001, 2, 16)}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_flush_wal_seconds",
			Help: "Time of one group commit spent writing to the file and fsyncing (bbolt's write time: pages, fdatasync, meta page, fdatasync).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		slowFsyncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_slow_fsyncs_total",
			Help: "Group commits that took longer than --slow-fsync-threshold (each is logged)."}),
		writeBytes: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_write_wal_bytes",
			Help: "WAL bytes of one SafeKeeperRequest.", Buckets: prometheus.ExponentialBuckets(64, 4, 8)}),
		appends: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_appends_total",
			Help: "SafeKeeperRequests with WAL received."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_wal_received_bytes_total",
			Help: "WAL bytes received from proposers."}),
	}
}

// timelineCollector reports every running timeline's positions at scrape
// time, and the server-wide gauges.
type timelineCollector struct{ a *API }

var (
	labels         = []string{"tenant_id", "timeline_id"}
	descFlush      = prometheus.NewDesc("safekeeper_flush_lsn", "flush_lsn of the timeline (a byte position).", labels, nil)
	descCommit     = prometheus.NewDesc("safekeeper_commit_lsn", "commit_lsn of the timeline.", labels, nil)
	descRemote     = prometheus.NewDesc("safekeeper_remote_consistent_lsn", "Highest remote_consistent_lsn a pageserver-style consumer reported.", labels, nil)
	descTerm       = prometheus.NewDesc("safekeeper_term", "The term this safekeeper voted for on the timeline.", labels, nil)
	descReaderLag  = prometheus.NewDesc("safekeeper_reader_lag_bytes", "commit_lsn minus the lowest position (the higher of write and flush) a reader reported; one that reported none yet counts from where its stream started. 0 without readers.", labels, nil)
	descActive     = prometheus.NewDesc("safekeeper_active_timelines", "Timelines open on this safekeeper.", nil, nil)
	descProposers  = prometheus.NewDesc("safekeeper_connected_proposers", "Timelines with a proposer connected and streaming.", nil, nil)
	descReaders    = prometheus.NewDesc("safekeeper_connected_readers", "Replication streams being served.", nil, nil)
	descDisk       = prometheus.NewDesc("safekeeper_disk_usage_bytes", "Size of the data directory's database file.", nil, nil)
	descDiskFree   = prometheus.NewDesc("safekeeper_disk_free_bytes", "Free space for unprivileged users on the data directory's file system.", nil, nil)
	descRemovedTo  = prometheus.NewDesc("safekeeper_removed_up_to_lsn", "removed_up_to of the timeline: WAL below it was removed by retention.", labels, nil)
	descRetained   = prometheus.NewDesc("safekeeper_retained_wal_bytes", "WAL the timeline holds on disk: flush_lsn minus removed_up_to (or the timeline's start), the timeline detail's wal_bytes.", labels, nil)
	descBreaker    = prometheus.NewDesc("safekeeper_disk_breaker_tripped", "1 while the disk circuit breaker refuses new WAL (53100).", nil, nil)
	descConns      = prometheus.NewDesc("safekeeper_connections", "Open client connections (limit: --max-connections).", nil, nil)
	descBackupLSN  = prometheus.NewDesc("safekeeper_backup_lsn", "backup_lsn of the timeline: its WAL is in the archive up to here.", labels, nil)
	descBackupLagB = prometheus.NewDesc("safekeeper_backup_lag_bytes", "commit_lsn minus backup_lsn: committed WAL not yet in the archive.", labels, nil)
	descBackupLagS = prometheus.NewDesc("safekeeper_backup_lag_seconds", "How long the archive has been behind commit_lsn (0: caught up).", labels, nil)
	descRemovedSeg = prometheus.NewDesc("safekeeper_removed_wal_segments_total", "WAL segments removed by retention since the server started.", nil, nil)
)

func (c *timelineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFlush, descCommit, descRemote, descTerm, descReaderLag, descActive, descProposers, descReaders, descDisk, descDiskFree, descRemovedTo, descRetained, descRemovedSeg, descBreaker, descConns, descBackupLSN, descBackupLagB, descBackupLagS} {
		ch <- d
	}
}

func (c *timelineCollector) Collect(ch chan<- prometheus.Metric) {
	tls := c.a.reg.Running()
	proposers, readers := 0, 0
	for _, tl := range tls {
		st := tl.State()
		l := []string{tl.Key().TenantID.String(), tl.Key().TimelineID.String()}
		ch <- prometheus.MustNewConstMetric(descFlush, prometheus.GaugeValue, float64(st.FlushLSN), l...)
		ch <- prometheus.MustNewConstMetric(descCommit, prometheus.GaugeValue, float64(st.CommitLSN), l...)
		ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(st.VotedFor.Term), l...)
		removed := max(st.RemovedUpTo, tl.RemovedUpTo())
		ch <- prometheus.MustNewConstMetric(descRemovedTo, prometheus.GaugeValue, float64(removed), l...)
		_, retained := storedWAL(st, removed)
		ch <- prometheus.MustNewConstMetric(descRetained, prometheus.GaugeValue, float64(retained), l...)
		remote, n, lag := tl.ReplicationSummary(st.CommitLSN) // lag: of the reader furthest behind
		readers += n
		ch <- prometheus.MustNewConstMetric(descRemote, prometheus.GaugeValue, float64(remote), l...)
		ch <- prometheus.MustNewConstMetric(descReaderLag, prometheus.GaugeValue, float64(lag), l...)
		if tl.Proposer().Connected {
			proposers++
		}
		if c.a.cfg.Archiving {
			b, d := tl.BackupLag(st.CommitLSN)
			ch <- prometheus.MustNewConstMetric(descBackupLSN, prometheus.GaugeValue, float64(tl.BackupLSN()), l...)
			ch <- prometheus.MustNewConstMetric(descBackupLagB, prometheus.GaugeValue, float64(b), l...)
			ch <- prometheus.MustNewConstMetric(descBackupLagS, prometheus.GaugeValue, d.Seconds(), l...)
		}
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(len(tls)))
	ch <- prometheus.MustNewConstMetric(descProposers, prometheus.GaugeValue, float64(proposers))
	ch <- prometheus.MustNewConstMetric(descReaders, prometheus.GaugeValue, float64(readers))
	ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(c.a.host.FileSize()))
	tripped := 0.0
	if c.a.host.WALRefused() != nil {
		tripped = 1
	}
	ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, tripped)
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(c.a.host.Connections()))
	var fs unix.Statfs_t
	if unix.Statfs(c.a.cfg.DataDir, &fs) == nil {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(fs.Bavail*uint64(fs.Bsize)))
	}
	ch <- prometheus.MustNewConstMetric(descRemovedSeg, prometheus.CounterValue, float64(c.a.reg.RemovedSegments()))
}

// refusedReasons are the reasons safekeeper_refused_total counts.
var refusedReasons = []string{"too_many_clients", "startup_evicted", "startup_timeout", "timelines", "slots", "disk", "http_wal_streams"}

func newRefusedCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "safekeeper_refused_total",
		Help: "Connections and requests refused by a resource limit, by reason."}, []string{"reason"})
	for _, r := range refusedReasons {
		c.WithLabelValues(r) // every series present from the start
	}
	return c
}
