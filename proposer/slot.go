package proposer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// slotKeeper holds the primary's physical replication slot at truncate_lsn:
// the lowest flush_lsn over all safekeepers, i.e. the oldest WAL some
// safekeeper may still need from the primary (the slot advances
// only to what every safekeeper still behind may need).
//
// The replication stream itself runs without the slot: a physical slot in
// use follows the flush position its walsender is told, and that position
// must be the quorum commit_lsn (it is what commits wait for). So the slot
// is advanced on its own, over a regular SQL connection, with
// pg_replication_slot_advance(slot, truncate_lsn), never backwards, at most
// once per interval.
type slotKeeper struct {
	connStr  string
	slot     string
	log      *slog.Logger
	interval time.Duration
	target   chan proto.LSN // latest truncate_lsn; capacity 1, newest wins
	start    proto.LSN      // the slot's restart_lsn when the session began
}

func newSlotKeeper(connStr, slot string, restartLSN proto.LSN, log *slog.Logger) *slotKeeper {
	return &slotKeeper{connStr: connStr, slot: slot, log: log, interval: time.Second, target: make(chan proto.LSN, 1), start: restartLSN}
}

// offer hands the keeper a new truncate_lsn without blocking.
func (k *slotKeeper) offer(lsn proto.LSN) {
	if lsn == 0 {
		return
	}
	select {
	case <-k.target:
	default:
	}
	k.target <- lsn
}

// run advances the slot until ctx ends. Errors are logged and retried: a
// slot held too far back only costs the primary disk, never correctness.
func (k *slotKeeper) run(ctx context.Context) {
	var pg *pgconn.PgConn
	advanced := k.start // a slot never moves backwards
	defer func() {
		if pg != nil {
			pg.Close(context.Background())
		}
	}()
	for {
		var want proto.LSN
		select {
		case <-ctx.Done():
			return
		case want = <-k.target:
		}
		if want > advanced {
			if pg == nil {
				cfg, err := pgconn.ParseConfig(k.connStr)
				if err == nil {
					delete(cfg.RuntimeParams, "replication")
					if cfg.Database == "" {
						cfg.Database = "postgres"
					}
					cfg.RuntimeParams["application_name"] = "safekeeper_slot_keeper"
					pg, err = pgconn.ConnectConfig(ctx, cfg)
				}
				if err != nil {
					k.log.Warn("cannot connect to advance the replication slot", "slot", k.slot, "err", err)
					pg = nil
				}
			}
			if pg != nil {
				res := pg.ExecParams(ctx, "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)",
					[][]byte{[]byte(k.slot), []byte(want.String())}, nil, nil, nil).Read()
				if res.Err != nil {
					k.log.Warn("cannot advance the replication slot", "slot", k.slot, "to", want, "err", res.Err)
					pg.Close(context.Background())
					pg = nil
				} else {
					advanced = want
					k.log.Debug("replication slot advanced to truncate_lsn", "slot", k.slot, "restart_lsn", fmt.Sprint(want))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(k.interval):
		}
	}
}
