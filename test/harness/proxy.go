package harness

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// PartitionMode says what a partitioned Proxy does with new connections.
type PartitionMode int

const (
	// Refuse accepts a new connection and resets it at once, as a host
	// answering with RST would.
	Refuse PartitionMode = iota
	// Blackhole accepts a new connection and holds it open without ever
	// reaching the target or answering, as a dropped route would; it is
	// closed at Heal.
	Blackhole
)

func (m PartitionMode) String() string {
	if m == Blackhole {
		return "blackhole"
	}
	return "refuse"
}

// Proxy is a fault-injecting TCP proxy on loopback, placed between a client
// (the proposer) and a server (a safekeeper): the client dials Addr, the
// proxy dials the target and copies bytes both ways. Cut resets every
// connection; Partition also refuses or blackholes new ones until Heal. It
// is closed by t.Cleanup. Methods are safe for concurrent use.
type Proxy struct {
	// Addr is the address clients dial: 127.0.0.1 and the port it bound (port 0).
	Addr   string
	target string
	ln     net.Listener
	t      testing.TB

	mu          sync.Mutex
	links       map[*link]struct{}
	held        map[net.Conn]struct{} // blackholed while partitioned
	partitioned bool
	mode        PartitionMode
	accepted    int // connections forwarded so far
	closed      bool
	wg          sync.WaitGroup
}

// link is one forwarded connection: the client's side and ours to the
// target.
type link struct{ client, server net.Conn }

func (l *link) reset() {
	resetConn(l.client)
	resetConn(l.server)
}

// resetConn closes c with RST (linger 0), so the peer sees the cut at once.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// StartProxy listens on a free loopback port and forwards every connection
// to target.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, t: t,
		links: map[*link]struct{}{}, held: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			resetConn(c)
			continue
		case p.partitioned && p.mode == Refuse:
			p.mu.Unlock()
			resetConn(c)
			continue
		case p.partitioned && p.mode == Blackhole:
			p.held[c] = struct{}{}
			p.mu.Unlock()
			p.wg.Add(1)
			go func() { // swallow whatever the client sends
				defer p.wg.Done()
				io.Copy(io.Discard, c)
			}()
			continue
		}
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		resetConn(client) // the target is down: so is the proxied address
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.closed || p.partitioned {
		p.mu.Unlock()
		l.reset()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	var once sync.Once
	end := func() {
		once.Do(func() {
			p.mu.Lock()
			delete(p.links, l)
			p.mu.Unlock()
			l.reset()
		})
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		io.Copy(server, client)
		end()
	}()
	io.Copy(client, server)
	end()
}

// Cut resets every open connection (both sides see a reset) and returns how
// many there were. New connections are forwarded as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := p.links
	p.links = map[*link]struct{}{}
	p.mu.Unlock()
	for l := range links {
		l.reset()
	}
	return len(links)
}

// Partition cuts every open connection and, until Heal, refuses or
// blackholes every new one.
func (p *Proxy) Partition(mode PartitionMode) {
	p.mu.Lock()
	p.partitioned, p.mode = true, mode
	p.mu.Unlock()
	p.Cut()
}

// Heal ends the partition: blackholed connections are reset (they never
// reached the target) and new connections are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.partitioned = false
	held := p.held
	p.held = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range held {
		resetConn(c)
	}
}

// Accepted returns how many connections have been forwarded so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Open returns how many forwarded connections are open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		p.t.Errorf("proxy: close: %v", err)
	}
	p.Cut()
	p.Heal()
	p.wg.Wait()
}
