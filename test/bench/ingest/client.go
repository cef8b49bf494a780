package ingest

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// Client is a benchmark proposer on one START_WAL_PUSH stream: greet, vote,
// ProposerElected, then SafeKeeperRequests with a bounded number in flight
// (Stream), as walproposer pushes WAL. It speaks the WAL push protocol (README_PROTO.md) with
// proto's message codecs over a proposer.Conn: receives go through it, sends
// write its socket directly (a request's header and WAL in one writev, the
// WAL not copied).
//
// A Client is used by one goroutine; Stream runs its own sender goroutine
// for the duration of the call.
type Client struct {
	conn   *proposer.Conn
	nc     net.Conn // conn.NetConn(), for the sends
	info   proto.ServerInfo
	ballot proto.Ballot
	wbuf   []byte
}

// Dial connects to the safekeeper at addr (host:port) as a proposer of the
// timeline info names and enters the WAL push stream (CopyBoth). The
// greeting is not sent yet: see Greet or Campaign.
func Dial(ctx context.Context, addr string, info proto.ServerInfo) (*Client, error) {
	conn, err := proposer.Dial(ctx, proposer.DialConfig{
		Addr: addr, TenantID: info.TenantID, TimelineID: info.TimelineID, ApplicationName: "bench-proposer", AllowTimelineCreation: true,
	})
	if err != nil {
		return nil, fmt.Errorf("connect to safekeeper %s: %w", addr, err)
	}
	return &Client{conn: conn, nc: conn.NetConn(), info: info}, nil
}

// Close drops the connection; the safekeeper makes what it received
// durable (rule 7).
func (c *Client) Close() error { return c.conn.Close() }

// Ballot is the ballot Vote was granted (zero before).
func (c *Client) Ballot() proto.Ballot { return c.ballot }

// copyDataHeader is the 'd' tag and int32 length of a CopyData frame.
const copyDataHeader = 5

// responseFrameSize is the bytes one SafeKeeperResponse takes on the wire
// (its CopyData frame): what the safekeeper write()s to the socket per
// request, to be told apart from its disk writes in /proc/PID/io.
var responseFrameSize = copyDataHeader + len((&proto.SafeKeeperResponse{}).Encode(nil))

// send writes one message as one CopyData.
func (c *Client) send(m proto.Message) error {
	c.wbuf = appendFrame(c.wbuf[:0], m, 0)
	_, err := c.nc.Write(c.wbuf)
	return err
}

// appendFrame appends the CopyData frame of m whose payload is followed by
// extra more bytes the caller writes after it (a request's WAL).
func appendFrame(b []byte, m proto.Message, extra int) []byte {
	start := len(b)
	b = append(b, 'd', 0, 0, 0, 0)
	b = m.Encode(b)
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-1+extra))
	return b
}

// recv returns the next safekeeper message, waiting until ctx is done.
// An ErrorResponse is returned as a *pgconn.PgError.
func (c *Client) recv(ctx context.Context) (proto.Message, error) {
	return c.conn.Recv(ctx)
}

func recvAs[M proto.Message](ctx context.Context, c *Client) (M, error) {
	var zero M
	m, err := c.recv(ctx)
	if err != nil {
		return zero, err
	}
	v, ok := m.(M)
	if !ok {
		return zero, fmt.Errorf("got %T, want %T", m, zero)
	}
	return v, nil
}

// Greet sends ServerInfo and returns the safekeeper's SafeKeeperInfo.
func (c *Client) Greet(ctx context.Context) (*proto.SafeKeeperInfo, error) {
	if err := c.send(&c.info); err != nil {
		return nil, err
	}
	return recvAs[*proto.SafeKeeperInfo](ctx, c)
}

// Vote asks for b and returns the fresh SafeKeeperInfo of the grant; a
// refusal is an error.
func (c *Client) Vote(ctx context.Context, b proto.Ballot) (*proto.SafeKeeperInfo, error) {
	if err := c.send(&proto.RequestVote{Candidate: b}); err != nil {
		return nil, err
	}
	v, err := recvAs[*proto.VoteResponse](ctx, c)
	if err != nil {
		return nil, err
	}
	if v.VotedFor != b {
		return nil, fmt.Errorf("vote for %v refused: the safekeeper voted for %v", b, v.VotedFor)
	}
	info, err := recvAs[*proto.SafeKeeperInfo](ctx, c)
	if err != nil {
		return nil, err
	}
	c.ballot = b
	return info, nil
}

// Campaign greets, wins term on this one safekeeper (a quorum of one) and
// sends ProposerElected, following rule 3: a timeline without WAL starts at
// start, one with WAL continues at the safekeeper's flush_lsn. It returns
// the LSN the first SafeKeeperRequest must begin at.
func (c *Client) Campaign(ctx context.Context, term uint64, start proto.LSN) (proto.LSN, error) {
	if _, err := c.Greet(ctx); err != nil {
		return 0, fmt.Errorf("greeting: %w", err)
	}
	info, err := c.Vote(ctx, proto.Ballot{Term: term, UUID: c.info.ProposerUUID})
	if err != nil {
		return 0, err
	}
	tlStart, h := start, proto.TermHistory{{Term: term, StartLSN: start}}
	if info.TimelineStartLSN != 0 {
		tlStart, start = info.TimelineStartLSN, info.FlushLSN
		h = append(info.History.Clone(), proto.TermSwitch{Term: term, StartLSN: start})
	}
	err = c.send(&proto.ProposerElected{Term: term, StartStreamingAt: start, TimelineStartLSN: tlStart, History: h})
	return start, err
}

// Heartbeat sends an empty SafeKeeperRequest at pos carrying commit and
// returns its response. No Stream may be running.
func (c *Client) Heartbeat(ctx context.Context, pos, commit proto.LSN) (*proto.SafeKeeperResponse, error) {
	if err := c.send(&proto.SafeKeeperRequest{Sender: c.ballot, BeginLSN: pos, EndLSN: pos, CommitLSN: commit}); err != nil {
		return nil, err
	}
	r, err := recvAs[*proto.SafeKeeperResponse](ctx, c)
	if err == nil && r.Term != c.ballot.Term {
		err = fmt.Errorf("deposed: the safekeeper is at term %d", r.Term)
	}
	return r, err
}

// StreamOptions shape one Stream.
type StreamOptions struct {
	// Piece is the WAL bytes per SafeKeeperRequest (the last one may be
	// shorter); at most proto.MaxWALPerRequest.
	Piece int
	// Window is how many requests may await their response at once.
	Window int
	// Commit sends, in every request, commit_lsn = the highest flush_lsn
	// acknowledged so far (with one safekeeper that is the quorum's), so
	// commit_lsn follows the stream as with a real proposer. False sends
	// CommitFrom throughout.
	Commit bool
	// CommitFrom is the commit_lsn to send until something is
	// acknowledged (the timeline's commit_lsn before the stream).
	CommitFrom proto.LSN
}

// StreamResult is what one Stream measured.
type StreamResult struct {
	Requests  int
	Bytes     int64
	Elapsed   time.Duration // first request written to the last response read
	FlushLSN  proto.LSN     // of the last response
	CommitLSN proto.LSN     // of the last response
	// AckP50 and AckP99 are the times from writing a request to reading its
	// response (they include the time the request waited in socket buffers
	// behind earlier ones).
	AckP50, AckP99 time.Duration
}

// MBps is the stream's rate in MB (10^6 bytes) per second.
func (r StreamResult) MBps() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// maxBatch bounds the bytes one write (writev) of the sender carries.
const maxBatch = 1 << 20

// Stream pushes wal, which begins at begin and must end at a record end, as
// SafeKeeperRequests of o.Piece bytes with at most o.Window unanswered, and
// returns once every request is answered. It checks each response: the
// current term (not deposed), flush_lsn never going back, and a last
// flush_lsn at the end of wal.
//
// A sender goroutine writes requests whenever the window has room, several
// per writev when several fit (like walproposer, which queues what it can
// and flushes once); the calling goroutine reads the responses and opens the
// window again, one request per response.
func (c *Client) Stream(ctx context.Context, wal []byte, begin proto.LSN, o StreamOptions) (StreamResult, error) {
	if o.Piece <= 0 || o.Piece > proto.MaxWALPerRequest || o.Window <= 0 {
		return StreamResult{}, fmt.Errorf("stream: bad options %+v", o)
	}
	n := (len(wal) + o.Piece - 1) / o.Piece
	end := begin + proto.LSN(len(wal))
	res := StreamResult{Requests: n, Bytes: int64(len(wal))}
	if n == 0 {
		return res, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Any failure (or ctx) unblocks both sides: the reader's read and the
	// sender's write fail at once. After a failed Stream the Client is
	// unusable.
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Now()) })
	defer stop()
	sentAt := make([]atomic.Int64, n)
	slots := make(chan struct{}, o.Window)
	var acked atomic.Uint64 // highest flush_lsn acknowledged
	acked.Store(uint64(o.CommitFrom))
	senderDone := make(chan error, 1)
	t0 := time.Now()
	go func() {
		senderDone <- c.sendAll(ctx, wal, begin, o, slots, sentAt, &acked)
	}()
	fail := func(err error) (StreamResult, error) {
		cancel()
		<-senderDone
		return res, err
	}
	lat := make([]time.Duration, n)
	var last *proto.SafeKeeperResponse
	for i := 0; i < n; i++ {
		r, err := recvAs[*proto.SafeKeeperResponse](ctx, c)
		if err != nil {
			// The safekeeper's ErrorResponse explains more than the
			// sender's broken pipe, so it comes first; a sender that
			// failed on its own (not by our cancel) is named too.
			err = fmt.Errorf("response %d of %d: %w", i+1, n, err)
			select {
			case serr := <-senderDone:
				if serr != nil {
					err = fmt.Errorf("%w (sender: %v)", err, serr)
				}
			default:
				cancel()
				<-senderDone
			}
			return res, err
		}
		lat[i] = time.Since(time.Unix(0, sentAt[i].Load()))
		<-slots
		switch {
		case r.Term != c.ballot.Term:
			return fail(fmt.Errorf("response %d: deposed, the safekeeper is at term %d", i+1, r.Term))
		case last != nil && r.FlushLSN < last.FlushLSN:
			return fail(fmt.Errorf("response %d: flush_lsn went back from %v to %v", i+1, last.FlushLSN, r.FlushLSN))
		}
		last = r
		acked.Store(uint64(max(r.FlushLSN, proto.LSN(acked.Load()))))
	}
	res.Elapsed = time.Since(t0)
	if err := <-senderDone; err != nil {
		return res, err
	}
	res.FlushLSN, res.CommitLSN = last.FlushLSN, last.CommitLSN
	if last.FlushLSN < end {
		return res, fmt.Errorf("last response: flush_lsn %v, want %v (the end of the WAL sent)", last.FlushLSN, end)
	}
	slices.Sort(lat)
	res.AckP50, res.AckP99 = lat[n/2], lat[min(n-1, n*99/100)]
	return res, nil
}

// sendAll is Stream's sender.
func (c *Client) sendAll(ctx context.Context, wal []byte, begin proto.LSN, o StreamOptions, slots chan struct{}, sentAt []atomic.Int64, acked *atomic.Uint64) error {
	n := len(sentAt)
	var hdrs []byte
	var offs []int
	iov := make(net.Buffers, 0, 256) // WriteTo consumes its slice: keep the array
	for i := 0; i < n; {
		// Wait for room for one request, then take what else fits now.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		first, batch := i, 0
		for {
			off := i * o.Piece
			piece := wal[off:min(off+o.Piece, len(wal))]
			commit := o.CommitFrom
			if o.Commit {
				commit = proto.LSN(acked.Load())
			}
			req := proto.SafeKeeperRequest{
				Sender: c.ballot, BeginLSN: begin + proto.LSN(off), EndLSN: begin + proto.LSN(off+len(piece)),
				CommitLSN: commit,
			}
			// The frame header and the request's fixed fields, then the
			// WAL itself straight from wal (writev): no copy of the WAL.
			offs = append(offs, len(hdrs))
			hdrs = appendFrame(hdrs, &req, len(piece))
			batch += len(piece)
			i++
			if i == n || batch >= maxBatch {
				break
			}
			select {
			case slots <- struct{}{}:
				continue
			default:
			}
			break
		}
		offs = append(offs, len(hdrs))
		bufs := iov[:0]
		for k := first; k < i; k++ {
			off := k * o.Piece
			bufs = append(bufs, hdrs[offs[k-first]:offs[k-first+1]], wal[off:min(off+o.Piece, len(wal))])
		}
		now := time.Now().UnixNano()
		for k := first; k < i; k++ {
			sentAt[k].Store(now)
		}
		iov = bufs[:0]
		if _, err := bufs.WriteTo(c.nc); err != nil {
			return fmt.Errorf("write request %d: %w", first+1, err)
		}
		hdrs, offs = hdrs[:0], offs[:0]
	}
	return nil
}
