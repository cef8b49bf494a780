package pgwire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// Test helpers: a real TCP listener on 127.0.0.1:0 and a small walsender-like
// handler, so that pgconn and pglogrepl can talk to this package.

type acceptResult struct {
	c   *Conn
	err error
}

// startServer accepts connections until the test ends; each goes through
// Accept, its result is reported on the returned channel, and a successful
// one is handled by handle in its own goroutine.
func startServer(t *testing.T, opts AcceptOptions, handle func(*Conn) error) (string, <-chan acceptResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan acceptResult, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := Accept(nc, opts)
				select {
				case results <- acceptResult{c, err}:
				default:
				}
				if err != nil {
					return
				}
				defer c.Close()
				if err := handle(c); err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("handler: %v", err)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), results
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Values served by the test walsender.
const (
	testSystemID      = "7234567890123456789"
	testServerVersion = "15.18 (pgwire test)"
)

var testKey = BackendKey{ProcessID: 4242, SecretKey: 0xdeadbeef}

// streamEvent is what the test walsender decoded from the client during
// START_REPLICATION.
type streamEvent any

// testWalsender answers a few replication commands and test commands.
// Decoded stream messages go to events (if not nil).
func testWalsender(events chan<- streamEvent) func(*Conn) error {
	return func(c *Conn) error {
		if err := c.Ready(WalsenderParams(testServerVersion, c.Params()), &testKey); err != nil {
			return err
		}
		for {
			q, err := c.ReadQuery()
			if err != nil {
				return err
			}
			q = strings.TrimSuffix(q, ";")
			switch {
			case q == "IDENTIFY_SYSTEM":
				err = c.SendRows(
					[]Column{TextColumn("systemid"), Int4Column("timeline"), TextColumn("xlogpos"), TextColumn("dbname")},
					[][][]byte{{[]byte(testSystemID), []byte("1"), []byte("0/16B3748"), nil}},
					"IDENTIFY_SYSTEM")
			case q == "SHOW_PARAMS": // the startup parameters, one row each
				var rows [][][]byte
				for k, v := range c.Params() {
					rows = append(rows, [][]byte{[]byte(k), []byte(v)})
				}
				sort.Slice(rows, func(i, j int) bool { return string(rows[i][0]) < string(rows[j][0]) })
				err = c.SendRows([]Column{TextColumn("name"), TextColumn("setting")}, rows, "SHOW")
			case q == "SHOW_TLS":
				v := "off"
				if c.TLS() {
					v = "on"
				}
				err = c.SendRows([]Column{TextColumn("tls")}, [][][]byte{{[]byte(v)}}, "SHOW")
			case q == "FAIL":
				err = c.SendError(Errorf(UndefinedFile, "requested WAL segment %s has already been removed", "000000010000000000000002"))
			case q == "FAIL_PLAIN":
				err = c.SendError(fmt.Errorf("wrapped: %w", errors.New("disk on fire")))
			case q == "NOTICE":
				if err = c.SendNotice(&Error{Message: "hello", Detail: "world"}); err == nil {
					err = c.SendCommandComplete("NOTICE")
				}
			case q == "":
				err = c.SendEmptyQueryResponse()
			case strings.HasPrefix(q, "START_REPLICATION"):
				err = testStream(c, q, events)
			default:
				err = c.SendError(Errorf(SyntaxError, "syntax error at or near %q", q))
			}
			if err != nil {
				return err
			}
			if err := c.SendReadyForQuery(); err != nil {
				return err
			}
		}
	}
}

// testWAL is the WAL the test walsender streams: larger than every buffer on
// the way (chunk reader, write buffer).
var testWAL = func() []byte {
	b := make([]byte, 128<<10)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}()

// testStream runs "START_REPLICATION ... X/X ...": a writer goroutine sends
// one XLogData and a keepalive while this (reader) goroutine decodes 'r', 'h'
// and 'z' messages until CopyDone, answering replyRequested with a keepalive
// that echoes the flush position.
func testStream(c *Conn, q string, events chan<- streamEvent) error {
	var start proto.LSN
	for _, f := range strings.Fields(q) {
		if l, err := proto.ParseLSN(f); err == nil {
			start = l
		}
	}
	if err := c.StartCopyBoth(); err != nil {
		return err
	}
	end := start + proto.LSN(len(testWAL))
	writerDone := make(chan error, 1)
	go func() {
		now := TimeToPG(time.Now())
		err := c.SendXLogData(&XLogData{DataStart: start, WALEnd: end, SendTime: now, Data: testWAL})
		if err == nil {
			err = c.SendKeepalive(&PrimaryKeepalive{WALEnd: end, SendTime: now})
		}
		if err == nil {
			err = c.Flush()
		}
		writerDone <- err
	}()
	for {
		payload, err := c.ReadCopy()
		if errors.Is(err, ErrCopyDone) {
			break
		}
		if err != nil {
			return err
		}
		var ev streamEvent
		switch payload[0] {
		case TagStandbyStatusUpdate:
			m, err := ParseStandbyStatusUpdate(payload)
			if err != nil {
				return err
			}
			if m.ReplyRequested {
				if err := c.SendKeepalive(&PrimaryKeepalive{WALEnd: m.Flush, SendTime: TimeToPG(time.Now())}); err != nil {
					return err
				}
				if err := c.Flush(); err != nil {
					return err
				}
			}
			ev = m
		case TagHotStandbyFeedback:
			ev, err = ParseHotStandbyFeedback(payload)
		case TagConsumerFeedback:
			ev, err = ParseConsumerFeedback(payload)
		default:
			err = malformed("unexpected stream message %q", payload[0])
		}
		if err != nil {
			return err
		}
		if events != nil {
			events <- ev
		}
	}
	if err := <-writerDone; err != nil {
		return err
	}
	if err := c.SendCopyDone(); err != nil {
		return err
	}
	if err := c.SendCommandComplete("START_STREAMING"); err != nil {
		return err
	}
	return c.SendCommandComplete("START_REPLICATION")
}
