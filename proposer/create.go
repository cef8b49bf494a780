package proposer

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// CreateConfig configures CreateTimeline.
type CreateConfig struct {
	// Safekeepers are the host:port addresses of all safekeepers of the
	// timeline.
	Safekeepers []string
	// TenantID and TimelineID name the new timeline.
	TenantID, TimelineID proto.ID
	// Configuration is the configuration the timeline is created in
	// (generation 1 and its members, when placed through etcd; generation
	// 0: none). Each safekeeper stores it with the timeline.
	Configuration proto.Configuration
	// Upstream, when set, is the primary's libpq connection string: the
	// system id, PostgreSQL version, segment size and PostgreSQL timeline
	// are read from it (IDENTIFY_SYSTEM, SHOW), and the fields below must
	// be zero.
	Upstream string
	// SystemID is the primary's database system identifier (without
	// Upstream, required).
	SystemID uint64
	// PgVersion (default 150000), WalSegSize (default 16 MiB) and
	// PgTimeline (default 1) describe the primary, without Upstream.
	PgVersion, WalSegSize, PgTimeline uint32
	// ConnectTimeout bounds each connection attempt. Default 10 s.
	ConnectTimeout time.Duration
	// Security: how to connect to the safekeepers (sslmode, sslrootcert,
	// password).
	Security Security
}

// CreateResult is what one safekeeper answered CreateTimeline.
type CreateResult struct {
	Addr string
	// Info is the safekeeper's state of the timeline once it holds it (a
	// timeline created now has term 0 and flush_lsn 0/0); nil with Err.
	Info *proto.SafeKeeperInfo
	Err  error
}

// CreateTimeline creates a timeline on its safekeepers: the step before a
// new timeline's first `propose`, which does not create one (Config.Create).
// It greets every safekeeper at once with a greeting allowed to create the
// timeline (START_WAL_PUSH (allow_timeline_creation true), then ServerInfo:
// the safekeeper creates it durably, in one transaction, before it answers)
// and returns each one's answer, in the order of cfg.Safekeepers. A
// safekeeper that already holds the timeline answers its state: creating
// twice is harmless; one holding it for another cluster refuses (22023).
// The error is ErrNoQuorum, naming each failure, when fewer than a quorum
// hold the timeline afterwards; the ones that do not are given it by the
// proposer's first greeting.
func CreateTimeline(ctx context.Context, cfg CreateConfig) ([]CreateResult, error) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	si := proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID,
		SystemID: cfg.SystemID, PgVersion: cfg.PgVersion, WalSegSize: cfg.WalSegSize, PgTimeline: cfg.PgTimeline,
		Configuration: cfg.Configuration.Clone(),
	}
	if cfg.Upstream != "" {
		if cfg.SystemID != 0 || cfg.PgVersion != 0 || cfg.WalSegSize != 0 || cfg.PgTimeline != 0 {
			return nil, errors.New("proposer: CreateConfig: Upstream and SystemID, PgVersion, WalSegSize, PgTimeline exclude each other")
		}
		up, err := client.DialReplication(ctx, "primary", cfg.Upstream, "timeline_create", cfg.ConnectTimeout)
		if err != nil {
			return nil, err
		}
		ui, err := up.Identify(ctx)
		up.Close()
		if err != nil {
			return nil, err
		}
		si.SystemID, si.PgVersion, si.WalSegSize, si.PgTimeline = ui.SystemID, ui.PgVersion, ui.SegSize, ui.Timeline
	}
	if si.PgVersion == 0 {
		si.PgVersion = 150000
	}
	if si.WalSegSize == 0 {
		si.WalSegSize = 16 << 20
	}
	if si.PgTimeline == 0 {
		si.PgTimeline = 1
	}
	if si.SystemID == 0 {
		return nil, errors.New("proposer: CreateConfig: SystemID or Upstream is required")
	}
	if _, err := io.ReadFull(rand.Reader, si.ProposerUUID[:]); err != nil {
		return nil, err
	}
	if err := si.Validate(); err != nil {
		return nil, err
	}
	out := make([]CreateResult, len(cfg.Safekeepers))
	var wg sync.WaitGroup
	for i, addr := range cfg.Safekeepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = CreateResult{Addr: addr}
			out[i].Info, out[i].Err = createOn(ctx, cfg, addr, &si)
		}()
	}
	wg.Wait()
	var held int
	var failed []string
	for _, r := range out {
		if r.Err == nil {
			held++
		} else {
			failed = append(failed, r.Addr+": "+endText(r.Err))
		}
	}
	if held < len(cfg.Safekeepers)/2+1 {
		return out, fmt.Errorf("%w: timeline %s/%s is on %d of %d safekeepers (%s)", ErrNoQuorum, cfg.TenantID, cfg.TimelineID,
			held, len(cfg.Safekeepers), strings.Join(failed, "; "))
	}
	return out, nil
}

// createOn greets the safekeeper at addr with a greeting allowed to create
// the timeline and returns its answer.
func createOn(ctx context.Context, cfg CreateConfig, addr string, si *proto.ServerInfo) (*proto.SafeKeeperInfo, error) {
	c, err := client.Dial(ctx, client.DialConfig{Addr: addr, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, ApplicationName: "timeline_create",
		AllowTimelineCreation: true, ConnectTimeout: cfg.ConnectTimeout, Security: cfg.Security})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Send(si); err != nil {
		return nil, err
	}
	gctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	m, err := c.Recv(gctx)
	if err != nil {
		return nil, err
	}
	info, ok := m.(*proto.SafeKeeperInfo)
	if !ok {
		return nil, fmt.Errorf("proposer: greeting %s: got %T, want SafeKeeperInfo", addr, m)
	}
	return info, nil
}
