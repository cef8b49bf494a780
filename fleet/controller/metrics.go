package controller

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	isLeader    prometheus.Gauge
	terms       prometheus.Counter
	placements  prometheus.Counter
	placeErrors *prometheus.CounterVec
	moveSteps   *prometheus.CounterVec
	moves       *prometheus.CounterVec
	moving      prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "safekeeper_controller_is_leader",
			Help: "1 while this controller leads (as far as it knows; its writes are fenced all the same), else 0."}),
		terms: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_controller_leader_terms_total",
			Help: "Times this controller became the leader."}),
		placements: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_controller_placements_total",
			Help: "Timelines this controller placed (configurations it created)."}),
		placeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "safekeeper_controller_placement_errors_total",
			Help: "Placement requests refused, by reason: the error code of the answer (not_leader, fenced, etcd_unavailable, no_room, bad_config, bad_request, ...)."},
			[]string{"reason"}),
		moveSteps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "safekeeper_controller_move_steps_total",
			Help: "Steps of timeline moves this controller took, by step: pull (a new member copied the timeline), joint, final, rollback (configurations written)."},
			[]string{"step"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "safekeeper_controller_moves_total",
			Help: "Timeline moves (migration requests) this controller ended, by outcome: done or failed."},
			[]string{"outcome"}),
		moving: prometheus.NewGauge(prometheus.GaugeOpts{Name: "safekeeper_controller_moves_in_progress",
			Help: "Timeline moves under way in this controller."}),
	}
	for _, s := range []string{"pull", "joint", "final", "rollback"} {
		m.moveSteps.WithLabelValues(s)
	}
	for _, o := range []string{"done", "failed"} {
		m.moves.WithLabelValues(o)
	}
	for _, r := range []string{"not_leader", "fenced", "etcd_unavailable", "no_room", "bad_config", "bad_request"} {
		m.placeErrors.WithLabelValues(r)
	}
	return m
}

// viewCollector turns the last view of the fleet (read every
// RefreshInterval, never per scrape) into gauges. Before the first read
// it reports none of them.
type viewCollector struct{ c *Controller }

var (
	nodesDesc = prometheus.NewDesc("safekeeper_fleet_nodes",
		"Safekeepers registered in etcd, by state: live (holding a lease) or down (a record without one).", []string{"state"}, nil)
	timelinesDesc = prometheus.NewDesc("safekeeper_fleet_timelines",
		"Timelines with a configuration in etcd.", nil, nil)
	belowQuorumDesc = prometheus.NewDesc("safekeeper_fleet_timelines_below_quorum",
		"Timelines with fewer live members than a majority of their members: none of them can commit.", nil, nil)
	badKeysDesc = prometheus.NewDesc("safekeeper_fleet_bad_keys",
		"Keys of the fleet in etcd that do not parse (GET /v1/cluster names them).", nil, nil)
	viewRevDesc = prometheus.NewDesc("safekeeper_fleet_view_revision",
		"The etcd revision the fleet gauges were read at.", nil, nil)
)

func (v *viewCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodesDesc, timelinesDesc, belowQuorumDesc, badKeysDesc, viewRevDesc} {
		ch <- d
	}
}

func (v *viewCollector) Collect(ch chan<- prometheus.Metric) {
	s := v.c.view.Load()
	if s == nil {
		return
	}
	live, down := s.LiveNodes()
	ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(live), "live")
	ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(down), "down")
	ch <- prometheus.MustNewConstMetric(timelinesDesc, prometheus.GaugeValue, float64(s.Timelines))
	ch <- prometheus.MustNewConstMetric(belowQuorumDesc, prometheus.GaugeValue, float64(len(s.BelowQuorum)))
	ch <- prometheus.MustNewConstMetric(badKeysDesc, prometheus.GaugeValue, float64(len(s.Errors)))
	ch <- prometheus.MustNewConstMetric(viewRevDesc, prometheus.GaugeValue, float64(s.Revision))
}
