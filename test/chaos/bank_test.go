package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// accounts is pgbench_accounts' size at scale 1.
const accounts = 100000

// transferScript is pgbench's side of the workload: the same transfer,
// without a record of which transactions committed (pgbench only counts).
const transferScript = `\set aid1 random(1, 100000 * :scale)
\set aid2 random(1, 100000 * :scale)
\set delta random(1, 1000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance - :delta WHERE aid = :aid1;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid2;
END;
`

// bank is the workload: transfers between pgbench_accounts (initially all
// balances 0, so the total stays 0). Each transfer made by the Go workers
// also inserts its id into transfers in the same transaction, so "every
// transaction the primary acknowledged is present" is checkable id by id.
type bank struct {
	t    *testing.T
	pg   *pgtest.Cluster
	host atomic.Pointer[string] // the primary's socket directory: moves with a promotion (nil: pg.SocketDir)
	next atomic.Int64
	stop chan struct{}
	hard context.CancelFunc // ends a hung commit at the very end (ambiguous)
	ctx  context.Context
	wg   sync.WaitGroup

	mu sync.Mutex
	// acked maps each acknowledged transfer to a WAL position below its
	// commit record (pg_current_wal_insert_lsn() after its INSERT).
	acked     map[int64]proto.LSN
	ambiguous int // errors at or around COMMIT: committed or not
	errs      []string
}

// newBank initialises pgbench_accounts (scale 1) and the transfers table.
func newBank(t *testing.T, pg *pgtest.Cluster) *bank {
	t.Helper()
	pg.Run(t, "pgbench", "-i", "-s", "1", "-q", "-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres")
	pg.Exec(t, "CREATE TABLE transfers(id bigint PRIMARY KEY, aid1 int, aid2 int, delta int)")
	ctx, cancel := context.WithCancel(context.Background())
	b := &bank{t: t, pg: pg, stop: make(chan struct{}), ctx: ctx, hard: cancel, acked: map[int64]proto.LSN{}}
	t.Cleanup(func() { b.halt(0) })
	return b
}

// start runs n workers; each has its own PRNG drawn from rng.
func (b *bank) start(n int, rng *rand.Rand) {
	for range n {
		r := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		b.wg.Add(1)
		go b.worker(r)
	}
}

func (b *bank) connect() (*pgconn.PgConn, *atomic.Bool, error) {
	host := b.pg.SocketDir
	if h := b.host.Load(); h != nil {
		host = *h
	}
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", host, b.pg.Port))
	if err != nil {
		return nil, nil, err
	}
	// Never a CancelRequest: a cancelled wait for synchronous replication
	// returns COMMIT with only a WARNING. The hard stop closes the socket.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	warned := new(atomic.Bool)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "synchronous replication") {
			warned.Store(true)
		}
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	return c, warned, err
}

func (b *bank) worker(r *rand.Rand) {
	defer b.wg.Done()
	var conn *pgconn.PgConn
	var warned *atomic.Bool
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		if conn == nil {
			var err error
			if conn, warned, err = b.connect(); err != nil {
				conn = nil
				select { // the primary is down or restarting: retry soon
				case <-b.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
		}
		id := b.next.Add(1)
		a1, a2 := 1+r.IntN(accounts), 1+r.IntN(accounts)
		if a1 > a2 {
			a1, a2 = a2, a1 // one lock order: no deadlocks between workers
		}
		delta := 1 + r.IntN(1000)
		warned.Store(false)
		res, err := conn.Exec(b.ctx, fmt.Sprintf(`BEGIN;
UPDATE pgbench_accounts SET abalance = abalance - %[4]d WHERE aid = %[2]d;
UPDATE pgbench_accounts SET abalance = abalance + %[4]d WHERE aid = %[3]d;
INSERT INTO transfers VALUES (%[1]d, %[2]d, %[3]d, %[4]d) RETURNING pg_current_wal_insert_lsn();
COMMIT`, id, a1, a2, delta)).ReadAll()
		var lsn proto.LSN
		if err == nil && len(res) == 5 && len(res[3].Rows) == 1 {
			lsn, err = proto.ParseLSN(string(res[3].Rows[0][0]))
		} else if err == nil {
			err = fmt.Errorf("unexpected results: %d", len(res))
		}
		b.mu.Lock()
		switch {
		case err == nil && !warned.Load():
			b.acked[id] = lsn
		default:
			b.ambiguous++
			if err == nil {
				err = fmt.Errorf("COMMIT returned with a warning: not known to be replicated")
			}
			if len(b.errs) < 5 {
				b.errs = append(b.errs, err.Error())
			}
		}
		b.mu.Unlock()
		if err != nil {
			if conn.IsClosed() {
				conn = nil
			} else if _, err := conn.Exec(b.ctx, "ROLLBACK").ReadAll(); err != nil {
				conn.Close(context.Background())
				conn = nil
			}
		}
	}
}

// ackedCount returns how many transfers have been acknowledged.
func (b *bank) ackedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.acked)
}

// snapshot returns the acknowledged transfers so far and the highest WAL
// position below one of their commit records.
func (b *bank) snapshot() (map[int64]bool, proto.LSN) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := make(map[int64]bool, len(b.acked))
	var hi proto.LSN
	for id, l := range b.acked {
		ids[id] = true
		hi = max(hi, l)
	}
	return ids, hi
}

// halt stops the workers after their current transfer; one still hung
// after grace (e.g. in a commit nobody acknowledges) has its socket closed
// and counts as ambiguous.
func (b *bank) halt(grace time.Duration) {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		b.hard()
		<-done
	}
}

// stopAndReport stops the workers and logs what they did.
func (b *bank) stopAndReport() {
	b.t.Helper()
	b.halt(60 * time.Second)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t.Logf("bank: %d transfers acknowledged, %d ambiguous (errors at commit: %q)", len(b.acked), b.ambiguous, b.errs)
}

// check verifies, on a server reachable by query: the total balance is 0,
// every acknowledged transfer is present, and (when want is not empty) the
// transfers equal want's (the primary's) summary.
func (b *bank) check(t *testing.T, where string, query func(sql string) string, acked map[int64]bool) string {
	t.Helper()
	if total := query("SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts"); total != "0" {
		t.Errorf("%s: total balance %s, want 0", where, total)
	}
	present := map[int64]bool{}
	for _, line := range strings.Fields(query("SELECT id FROM transfers")) {
		id, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			t.Fatalf("%s: transfer id %q", where, line)
		}
		present[id] = true
	}
	var lost []int64
	for id := range acked {
		if !present[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%s: %d acknowledged transfers missing, e.g. %v", where, len(lost), lost[:min(10, len(lost))])
	}
	summary := query("SELECT count(*) || ' transfers, id sum ' || coalesce(sum(id), 0) || ', accounts ' || (SELECT count(*) FROM pgbench_accounts) FROM transfers")
	t.Logf("%s: total balance 0; %s; all %d acknowledged present", where, summary, len(acked))
	return summary
}

var (
	pgbenchFailedRe = regexp.MustCompile(`number of failed transactions: (\d+)`)
	pgbenchDoneRe   = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
)

// pgbench runs the transfer script with clients for d and returns its
// output (an error if pgbench failed or reported failed transactions).
func pgbench(ctx context.Context, t *testing.T, pg *pgtest.Cluster, clients int, d time.Duration) (string, error) {
	dir := pgtest.Dir(t, "chaos-")
	script := filepath.Join(dir, "transfer.sql")
	if err := os.WriteFile(script, []byte(transferScript), 0o644); err != nil {
		return "", err
	}
	out, err := pg.Cmd(ctx, "pgbench", "-n", "-f", script, "-c", strconv.Itoa(clients), "-j", "1",
		"-T", strconv.Itoa(int(d/time.Second)), "--max-tries", "10",
		"-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("pgbench: %v", err)
	}
	if m := pgbenchFailedRe.FindStringSubmatch(string(out)); m == nil || m[1] != "0" {
		return string(out), fmt.Errorf("pgbench reported failed transactions")
	}
	if m := pgbenchDoneRe.FindStringSubmatch(string(out)); m == nil || m[1] == "0" {
		return string(out), fmt.Errorf("pgbench committed nothing")
	}
	return string(out), nil
}

// startBig runs n workers that write large WAL records until the bank
// stops: logical messages of up to 1 MiB (transactional or not), rows of
// 8–40 kB (uncompressed, stored out of line) and updates of them. Right
// after a CHECKPOINT their first changes carry full-page images too.
func (b *bank) startBig(n int, rng *rand.Rand) {
	b.t.Helper()
	b.pg.Exec(b.t, "CREATE TABLE IF NOT EXISTS wide(id serial PRIMARY KEY, pad text); ALTER TABLE wide ALTER pad SET STORAGE EXTERNAL")
	for range n {
		r := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		b.wg.Add(1)
		go b.bigWorker(r)
	}
}

func (b *bank) bigWorker(r *rand.Rand) {
	defer b.wg.Done()
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		if conn == nil {
			var err error
			if conn, _, err = b.connect(); err != nil {
				conn = nil
				select {
				case <-b.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
		}
		// md5 of random(): incompressible text, 32 bytes a piece.
		var sql string
		switch r.IntN(4) {
		case 0:
			sql = fmt.Sprintf("SELECT pg_logical_emit_message(false, 'chaos', repeat(md5(random()::text), %d))", 1+r.IntN(32<<10))
		case 1:
			sql = fmt.Sprintf("SELECT pg_logical_emit_message(true, 'chaos', repeat(md5(random()::text), %d))", 1+r.IntN(8<<10))
		case 2:
			sql = fmt.Sprintf("INSERT INTO wide(pad) SELECT string_agg(md5(random()::text), '') FROM generate_series(1, %d)", 256+r.IntN(1024))
		case 3:
			sql = fmt.Sprintf("UPDATE wide SET pad = (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, %d)) WHERE id %% 50 = %d", 256+r.IntN(1024), r.IntN(50))
		}
		if _, err := conn.Exec(b.ctx, sql).ReadAll(); err != nil && conn.IsClosed() {
			conn = nil
		}
	}
}
