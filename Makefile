# safekeeper — see README.md.
GO      ?= go
BIN     := bin/safekeeper
PKGS    := ./...

.PHONY: build test test-slowest test-unit demo sim chaos vet fmt bench bench-e2e clean

# The version the binary reports (safekeeper version, /v1/status).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X github.com/safekeeper/safekeeper/server.Version=$(VERSION)" -o $(BIN) ./cmd/safekeeper

# Every test: unit, fuzz seed corpora (go test runs them as ordinary tests),
# real-PostgreSQL and socket-level integration tests, all under the race
# detector. The integration tests build the safekeeper binary themselves.
# gotestsum (go.mod's tool directive: `go tool gotestsum`, offline after
# `go mod download`) runs go test -json and prints a line per test as it
# ends, then the skipped tests, then every failed test's full output, last;
# the exit status is go test's. The events go to $(TEST_JSON); on success
# the slowest tests are listed from it (`make test-slowest` lists them again).
# -timeout guards against a hung test binary, per package: the largest,
# test/, takes about 7 minutes alone on 2 cores and twice that on a shared
# machine (two runs at once ran past 12 minutes).
TEST_JSON ?= bin/test.json
test: build
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) tool gotestsum --format testname --jsonfile $(TEST_JSON) -- -race -count=1 -timeout 18m $(PKGS)
	@$(MAKE) --no-print-directory test-slowest

test-slowest:
	@echo "slowest tests (from $(TEST_JSON)):"
	@$(GO) tool gotestsum tool slowest --jsonfile $(TEST_JSON) --num 15 --threshold 0

# The main job on real input: PostgreSQL 15 primary -> proposer -> 3 safekeepers
# under pgbench, a standby fed by a safekeeper, byte-for-byte checks, a report.
demo: build
	bash scripts/demo.sh

# The deterministic simulation over many seeds (make test runs 200).
# Replay one: go test ./test/sim -run 'TestSim$$' -seed=N
SEEDS ?= 5000
sim:
	$(GO) test ./test/sim -run 'TestSim$$' -seeds=$(SEEDS) -timeout 0 -v

# The long crash loop (test/chaos TestChaos): safekeeper and proposer kills,
# partitions, then the invariant checks. make test runs the short forms.
CHAOS_DURATION ?= 10m
CHAOS_SEED     ?= 0
chaos: build
	$(GO) test -count=1 -timeout 0 -v ./test/chaos -run '^TestChaos$$' -chaos.duration=$(CHAOS_DURATION) -chaos.seed=$(CHAOS_SEED)

# The end-to-end benchmark (test/bench/e2e): one primary under pgbench,
# rounds alternating between one stock sync standby (A1), three with ANY 2
# (A3) and the proposer with 3 safekeepers (B); medians, B/A ratios, and the
# bench-e2e section of docs/performance.md rewritten (BENCH_WRITE_DOC=0: not).
# Knobs: BENCH_ROUNDS (3), BENCH_SECONDS (15), BENCH_CLIENTS (8), BENCH_JOBS (2),
# BENCH_CLIENTS_LOW (1: a second pass of rounds at 1 client, 0: none),
# BENCH_SCALE (10), BENCH_WARMUP (3 s per configuration, 0: none), BENCH_PERF
# (1: perf stat per node in the last round of each configuration, 0: none).
bench-e2e: build
	SAFEKEEPER_BIN=$(CURDIR)/$(BIN) $(GO) test ./test/bench/e2e -run '^TestBenchE2E$$' -count=1 -timeout 0 -v -args -bench.e2e

test-unit:
	$(GO) test -short -count=1 $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./storage/ ./proto/... ./acceptor/

# One safekeeper's ingest (test/bench/ingest TestBenchIngest): 1 GiB over one
# push connection in 128 KiB and in 8 KiB appends, against dd oflag=dsync on
# the same filesystem, alternating over BENCH_ROUNDS rounds; bytes written
# per WAL byte and syscalls per request. Writes docs/performance.md unless
# BENCH_WRITE_DOC=0. Smaller: BENCH_INGEST_BYTES=256M (also BENCH_DD8K_BYTES,
# BENCH_TRACE_BYTES); the window: BENCH_ARGS=-bench.window=64.
# (Their own .PHONY line: other bench targets are added next to them.)
.PHONY: bench-ingest bench-scale
BENCH_ARGS ?=
bench-ingest:
	$(GO) test ./test/bench/ingest -run '^TestBenchIngest$$' -count=1 -timeout 0 -v -args -bench.ingest $(BENCH_ARGS)

# Many timelines and a reader far behind (TestBenchScale): 10,000 timelines
# given 64 KiB of WAL each (640 MiB in all) over their own connections, their
# idle memory once closed and every one served again, aggregate ingest of
# 10,000 and 1,000 timelines against one, a reader 1 GiB behind catching up
# during ingest. Smaller: BENCH_TIMELINES=200 BENCH_TIMELINES_SMALL=100
# BENCH_SCALE_BYTES=256M BENCH_READER_BEHIND=256M BENCH_READER_INGEST=128M. BENCH_IDLE_WAIT=360s
# also measures idle RSS and the live heap that long after the close, past Go's
# forced GCs (every 2 min): once, in the first round.
bench-scale:
	$(GO) test ./test/bench/ingest -run '^TestBenchScale$$' -count=1 -timeout 0 -v -args -bench.scale $(BENCH_ARGS)

# The WAL archive against pgBackRest (test/bench/archive TestBenchArchive),
# both into one versitygw serving TLS on 127.0.0.1, rounds alternating:
# the upload of the same BENCH_SEGMENTS 16 MiB segments of pgbench WAL (one
# safekeeper with --remote-storage from the start until backup_lsn reaches
# their end, against archive-push async with process-max 4, zstd), their
# restore (wal fetch --remote-storage against archive-get, with and without
# async), the compression ratio; then under pgbench through the proposer
# and three safekeepers, rounds of no archive, the safekeepers' archive and
# archive_command = pgbackrest archive-push (archive_timeout 60s): TPS and
# the archive's lag behind the primary's flush LSN (every 100 ms, p50/p99).
# Needs pgbackrest (apt-get install pgbackrest) and versitygw (.ci/run
# builds it). Knobs: BENCH_ROUNDS (5), BENCH_SEGMENTS (32), BENCH_SECONDS
# (20 per round under pgbench), BENCH_CLIENTS (8), BENCH_JOBS (2),
# BENCH_SCALE (10), BENCH_WARMUP (10 s: one unreported round per
# configuration under pgbench, 0: none). Writes docs/performance.md's
# bench-archive section unless BENCH_WRITE_DOC=0. About 15 minutes; short:
# BENCH_ROUNDS=1 BENCH_SEGMENTS=4 BENCH_SECONDS=10 BENCH_WARMUP=0.
.PHONY: bench-archive
bench-archive: build
	SAFEKEEPER_BIN=$(CURDIR)/$(BIN) $(GO) test ./test/bench/archive -run '^TestBenchArchive$$' -count=1 -timeout 0 -v -args -bench.archive

# The fleet in etcd (test/bench/fleet TestBenchFleet): one etcd member,
# BENCH_SAFEKEEPERS (6) safekeepers in BENCH_ZONES (3) zones registered
# with --etcd-lease-ttl BENCH_LEASE_TTL (10), BENCH_TIMELINES (1000)
# timelines placed through etcd (in-process: Place, then CreateTimeline on
# the members), then two primaries under pgbench at once, each through a
# proposer to three safekeepers of its own: one proposer with
# --etcd-endpoints, the other with --safekeepers, swapped each cycle; then
# etcd-low (one primary through etcd at BENCH_CLIENTS_LOW clients): etcd's
# writes, Raft proposals and lease keepalives per second from its /metrics
# (and in an idle window of BENCH_IDLE s), TPS etcd/static side by side.
# Knobs: BENCH_ROUNDS (8 cycles, even), BENCH_SECONDS (20), BENCH_CLIENTS
# (4 per primary), BENCH_CLIENTS_LOW (1), BENCH_JOBS (2), BENCH_SCALE (10),
# BENCH_IDLE (20), BENCH_WARMUP (5 s, 0: none). Writes docs/performance.md's
# bench-fleet section unless BENCH_WRITE_DOC=0. About 9 minutes; short:
# BENCH_TIMELINES=50 BENCH_ROUNDS=2 BENCH_SECONDS=5 BENCH_IDLE=5 BENCH_WARMUP=0.
.PHONY: bench-fleet
bench-fleet: build
	SAFEKEEPER_BIN=$(CURDIR)/$(BIN) $(GO) test ./test/bench/fleet -run '^TestBenchFleet$$' -count=1 -timeout 0 -v -args -bench.fleet

# Moving a timeline while it commits (test/bench/move TestBenchMove): one
# etcd member, six safekeepers in three zones, a controller, a primary under
# one pgbench -c BENCH_CLIENTS (4) -l run; every BENCH_SECONDS (10) a
# `timeline migrate --members` between {1,2,3} and {4,5,6}, BENCH_MOVES (6)
# times: per move and over all of them the longest transaction (the commit
# stall) against the steady spells between moves. Knobs also BENCH_SCALE
# (10). Writes docs/performance.md's bench-move section unless
# BENCH_WRITE_DOC=0. About 3 minutes.
.PHONY: bench-move
bench-move: build
	SAFEKEEPER_BIN=$(CURDIR)/$(BIN) $(GO) test ./test/bench/move -run '^TestBenchMove$$' -count=1 -timeout 0 -v -args -bench.move

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
