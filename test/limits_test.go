package test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// startupPacket is a protocol 3.0 StartupMessage.
func startupPacket(params ...string) []byte {
	var body []byte
	body = binary.BigEndian.AppendUint32(body, 196608)
	for _, p := range params {
		body = append(append(body, p...), 0)
	}
	body = append(body, 0)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body)+4)), body...)
}

// firstAnswer reads the server's first message after a startup packet:
// "ok" for AuthenticationOk, or the SQLSTATE of an ErrorResponse.
func firstAnswer(c net.Conn) (string, error) {
	r := bufio.NewReader(c)
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	switch hdr[0] {
	case 'R':
		return "ok", nil
	case 'E':
		for _, f := range bytes.Split(body, []byte{0}) {
			if len(f) > 1 && f[0] == 'C' {
				return string(f[1:]), nil
			}
		}
	}
	return "", fmt.Errorf("unexpected message %q", hdr[0])
}

// scrapeFamilies is sk's /metrics, parsed.
func scrapeFamilies(t *testing.T, sk *harness.Safekeeper) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + sk.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// scrapeMetric returns one metric's value (with label reason=reason, if given).
func scrapeMetric(t *testing.T, sk *harness.Safekeeper, name, reason string) float64 {
	t.Helper()
	for _, m := range scrapeFamilies(t, sk)[name].GetMetric() {
		ok := reason == ""
		for _, l := range m.GetLabel() {
			ok = ok || (l.GetName() == "reason" && l.GetValue() == reason)
		}
		if ok {
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no metric %s{reason=%q}", name, reason)
	return 0
}

// TestMaxConnections: 1,100 connections against --max-connections 1000:
// those over the limit get FATAL 53300 "sorry, too many clients already",
// the others their AuthenticationOk, and a push stream and a reader that
// were running before go on. (On a machine whose open-file limit cannot
// hold that many, the numbers are scaled down and logged.)
func TestMaxConnections(t *testing.T) {
	maxConns, clients := 1000, 1100
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < 2600 {
		maxConns = int(rl.Cur-200) / 2
		clients = maxConns + maxConns/10
		t.Logf("open-file limit %d: %d connections against --max-connections %d", rl.Cur, clients, maxConns)
	}
	sk := harness.StartSafekeeper(t, 1, "--max-connections", fmt.Sprint(maxConns))
	pushSome := streamTerm1(t, sk)
	end := pushSome()
	rd := replConn(t, sk, 1) // a reader connected before the flood
	conns := make([]net.Conn, clients)
	answers := make([]string, clients)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := net.DialTimeout("tcp", sk.Addr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
		defer c.Close()
		wg.Add(1)
		go func(i int, c net.Conn) {
			defer wg.Done()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := c.Write(startupPacket("user", "flood", "replication", "true")); err != nil {
				answers[i] = err.Error()
				return
			}
			a, err := firstAnswer(c)
			if err != nil {
				a = err.Error()
			}
			answers[i] = a
		}(i, c)
		if i%100 == 99 {
			wg.Wait() // in order: the first ones hold the slots
		}
	}
	wg.Wait()
	count := map[string]int{}
	for _, a := range answers {
		count[a]++
	}
	t.Logf("answers: %v", count)
	// Two connections of the stream and the reader hold slots too.
	if count["53300"] < clients-maxConns+2 || count["ok"]+count["53300"] != clients {
		t.Fatalf("answers %v: want %d refused with 53300 and the rest ok", count, clients-maxConns+2)
	}
	if got := scrapeMetric(t, sk, "safekeeper_refused_total", "too_many_clients"); got < float64(count["53300"]) {
		t.Fatalf("safekeeper_refused_total{reason=too_many_clients} %v, want %d", got, count["53300"])
	}
	// The stream that was running goes on, and so does the reader.
	end = pushSome()
	if st := harness.StatusRow(t, rd); st["flush_lsn"] != end.String() {
		t.Fatalf("the reader after the flood: flush_lsn %s, want %s", st["flush_lsn"], end)
	}
	for _, c := range conns {
		c.Close()
	}
	// Closed connections free their slots: a new client gets in.
	harness.WaitFor(t, 30*time.Second, "a new connection accepted after the flood left", func() bool {
		c, err := net.DialTimeout("tcp", sk.Addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(startupPacket("user", "late", "replication", "true"))
		a, _ := firstAnswer(c)
		return a == "ok"
	})
}

// TestSlowlorisCutAtAuthenticationTimeout: 500 connections that send half a
// startup packet and then nothing are closed by the server at
// --authentication-timeout (2 s here), while a normal client still gets
// in; each is counted as a startup_timeout.
func TestSlowlorisCutAtAuthenticationTimeout(t *testing.T) {
	const n, timeout = 500, 2 * time.Second
	sk := harness.StartSafekeeper(t, 1, "--authentication-timeout", timeout.String())
	began := time.Now()
	closed := make(chan time.Duration, n)
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", sk.Addr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		defer c.Close()
		pkt := startupPacket("user", "slow")
		if _, err := c.Write(pkt[:6]); err != nil { // the length and half the version
			t.Fatal(err)
		}
		go func() {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			var b [1]byte
			_, err := c.Read(b[:])
			if err == nil {
				err = fmt.Errorf("got a byte")
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				closed <- -1 // not closed by the server
				return
			}
			closed <- time.Since(began)
		}()
	}
	// Meanwhile a normal client is served.
	startTerm(t, sk, 1, 1) // greeting, vote, election: served
	var latest time.Duration
	for i := 0; i < n; i++ {
		d := <-closed
		if d < 0 {
			t.Fatal("a half-open connection was still open after 30 s")
		}
		latest = max(latest, d)
	}
	if latest < timeout-200*time.Millisecond || latest > timeout+10*time.Second {
		t.Fatalf("the last half-open connection closed after %v; --authentication-timeout is %v", latest, timeout)
	}
	harness.WaitFor(t, 10*time.Second, "every cut counted", func() bool {
		return scrapeMetric(t, sk, "safekeeper_refused_total", "startup_timeout") >= n
	})
	t.Logf("%d half-open connections closed by %v (timeout %v)", n, latest, timeout)
}

// TestIdleConnectionsDoNotLockOutClients: with --max-connections 50 held
// by idle TCP sockets (connected, nothing sent), new clients still get in:
// each takes the slot of the oldest socket still in its startup, which the
// server closes (well before --authentication-timeout) and counts in
// safekeeper_refused_total{reason="startup_evicted"}. A push stream and a
// reader running before go on, and once the sockets are gone the
// connections gauge is back where it was. When every slot is held by a
// connection past its startup, a newcomer still gets 53300 and nothing is
// evicted.
func TestIdleConnectionsDoNotLockOutClients(t *testing.T) {
	const maxConns, extra = 50, 10
	sk := harness.StartSafekeeper(t, 1, "--max-connections", fmt.Sprint(maxConns))
	pushSome := streamTerm1(t, sk)
	end := pushSome()
	rd := replConn(t, sk, 1) // a reader connected before the idle sockets
	connections := func() int { return int(scrapeMetric(t, sk, "safekeeper_connections", "")) }
	evicted := func() float64 { return scrapeMetric(t, sk, "safekeeper_refused_total", "startup_evicted") }
	if got := evicted(); got != 0 {
		t.Fatalf("startup_evicted %v before any eviction", got)
	}
	base := connections()
	if base <= 0 || base >= maxConns {
		t.Fatalf("%d connections open before the idle sockets", base)
	}

	// Idle sockets fill every free slot, then extra more arrive: each takes
	// the slot of the oldest idle one.
	dialIdle := func() net.Conn {
		c, err := net.DialTimeout("tcp", sk.Addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var idle []net.Conn
	for len(idle) < maxConns-base {
		idle = append(idle, dialIdle())
	}
	harness.WaitFor(t, 10*time.Second, "the idle sockets to hold every slot", func() bool { return connections() == maxConns })
	for range extra {
		idle = append(idle, dialIdle())
	}
	// A real client arriving after them is served: a raw startup gets
	// AuthenticationOk, not 53300.
	c := dialIdle()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(startupPacket("user", "late", "replication", "true")); err != nil {
		t.Fatal(err)
	}
	if a, err := firstAnswer(c); a != "ok" {
		t.Fatalf("a client arriving with every slot held by idle sockets: answer %q (%v), want AuthenticationOk", a, err)
	}
	harness.WaitFor(t, 10*time.Second, "the evictions counted", func() bool { return evicted() >= extra+1 })
	if n := connections(); n != maxConns {
		t.Fatalf("%d connections after evictions, want %d", n, maxConns)
	}
	// The evicted ones (the oldest) are closed by the server within about a
	// second, not at --authentication-timeout (1 min).
	for i, c := range idle[:extra+1] {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		var b [1]byte
		if _, err := c.Read(b[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("evicted idle socket %d: read %v, want it closed by the server", i, err)
		}
	}
	// A replication connection runs TIMELINE_STATUS.
	late := replConn(t, sk, 1)
	if st := harness.StatusRow(t, late); st["flush_lsn"] != end.String() {
		t.Fatalf("TIMELINE_STATUS of the late client: flush_lsn %s, want %s", st["flush_lsn"], end)
	}
	if got := evicted(); got < extra+2 {
		t.Fatalf("startup_evicted %v after two clients, want at least %d", got, extra+2)
	}

	// The stream that was running goes on, and so does the reader.
	end = pushSome()
	if st := harness.StatusRow(t, rd); st["flush_lsn"] != end.String() {
		t.Fatalf("the reader after the evictions: flush_lsn %s, want %s", st["flush_lsn"], end)
	}

	// Every slot is given back once: the gauge returns to where it was.
	for _, c := range idle {
		c.Close()
	}
	c.Close()
	late.Close(harness.Context(t, 10*time.Second))
	harness.WaitFor(t, 10*time.Second, "the connections gauge back to its baseline", func() bool { return connections() == base })

	// Slots held by connections past their startup are not taken: the
	// newcomer gets 53300 and nothing is evicted.
	for range maxConns - base {
		c := dialIdle()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(startupPacket("user", "holder", "replication", "true")); err != nil {
			t.Fatal(err)
		}
		if a, err := firstAnswer(c); a != "ok" {
			t.Fatalf("filling the slots: answer %q (%v)", a, err)
		}
	}
	before := evicted()
	c = dialIdle()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(startupPacket("user", "late", "replication", "true")); err != nil {
		t.Fatal(err)
	}
	if a, err := firstAnswer(c); a != "53300" {
		t.Fatalf("a client arriving with every slot held past its startup: answer %q (%v), want 53300", a, err)
	}
	if got := evicted(); got != before {
		t.Fatalf("startup_evicted went from %v to %v: a connection past its startup was evicted", before, got)
	}
}

// streamTerm1 makes the test a proposer of term 1 on sk and returns a push:
// one more record, sent and waited for until it is flushed; its end.
func streamTerm1(t *testing.T, sk *harness.Safekeeper) func() proto.LSN {
	p := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	return func() proto.LSN {
		begin := gen.Pos()
		gen.Record(2000)
		wal := gen.Take()
		end := begin + proto.LSN(len(wal))
		p.send(p.appendReq(begin, wal, end))
		for p.resp().FlushLSN < end {
		}
		return end
	}
}
