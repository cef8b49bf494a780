package httpapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/safekeeper/safekeeper/proto"
)

// The headers of GET .../wal naming the range served.
const (
	WALStartHeader = "X-Wal-Start"
	WALEndHeader   = "X-Wal-End"
)

// TimelinePath is the API path of a timeline.
func TimelinePath(key proto.TimelineKey) string {
	return "/v1/tenant/" + key.TenantID.String() + "/timeline/" + key.TimelineID.String()
}

// Client calls a safekeeper's HTTP API (the CLI's status, timeline
// list|show|delete and wal dump --http). Each call returns the decoded
// answer and its raw body (what --json prints); an answer other than 200
// is an error of one line: the API's own message and code, else the
// status and the start of the body.
type Client struct {
	http  *http.Client
	base  string // scheme://host:port
	addr  string // as given, for messages
	token string
}

// SplitAddr splits an API address as the CLI's --http takes it —
// host:port, http://host:port or https://host:port — into its scheme
// and host:port.
func SplitAddr(addr string) (scheme, hostPort string) {
	if rest, ok := strings.CutPrefix(addr, "https://"); ok {
		return "https", rest
	}
	return "http", strings.TrimPrefix(addr, "http://")
}

// NewClient is a client of the API at addr (see SplitAddr). rootCAs
// verifies an https:// API (nil: the system's); token, when not empty, is
// presented as Authorization: Bearer.
func NewClient(addr string, rootCAs *x509.CertPool, token string) *Client {
	scheme, hostPort := SplitAddr(addr)
	c := &Client{http: http.DefaultClient, base: scheme + "://" + hostPort, addr: addr, token: token}
	if rootCAs != nil {
		c.http = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: rootCAs, MinVersion: tls.VersionTLS12}}}
	}
	return c
}

// Status is GET /v1/status.
func (c *Client) Status(ctx context.Context) (*Status, []byte, error) {
	var st Status
	body, err := c.Do(ctx, http.MethodGet, "/v1/status", &st)
	return &st, body, err
}

// Timelines is GET /v1/tenant/timeline.
func (c *Client) Timelines(ctx context.Context) ([]TimelineSummary, []byte, error) {
	var list []TimelineSummary
	body, err := c.Do(ctx, http.MethodGet, "/v1/tenant/timeline", &list)
	return list, body, err
}

// Timeline is GET /v1/tenant/{tenant_id}/timeline/{timeline_id}.
func (c *Client) Timeline(ctx context.Context, key proto.TimelineKey) (*Timeline, []byte, error) {
	var tl Timeline
	body, err := c.Do(ctx, http.MethodGet, TimelinePath(key), &tl)
	return &tl, body, err
}

// DeleteTimeline is DELETE /v1/tenant/{tenant_id}/timeline/{timeline_id}
// (withArchive: ?archive=true, its archive too).
func (c *Client) DeleteTimeline(ctx context.Context, key proto.TimelineKey, force, withArchive bool) (*DeleteResult, []byte, error) {
	var res DeleteResult
	q := "?force=" + strconv.FormatBool(force)
	if withArchive {
		q += "&archive=true"
	}
	body, err := c.Do(ctx, http.MethodDelete, TimelinePath(key)+q, &res)
	return &res, body, err
}

// SetMembership is PUT .../membership: the timeline adopts conf if its
// generation is above the one it holds (README_PROTO.md, rule 9).
func (c *Client) SetMembership(ctx context.Context, key proto.TimelineKey, conf proto.Configuration) (*MembershipSwitch, []byte, error) {
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, nil, err
	}
	var res MembershipSwitch
	body, err := c.send(ctx, http.MethodPut, TimelinePath(key)+"/membership", b, &res)
	return &res, body, err
}

// TermBump is POST .../term_bump.
func (c *Client) TermBump(ctx context.Context, key proto.TimelineKey, term uint64) (*TermBumpResponse, error) {
	b, _ := json.Marshal(TermBumpRequest{Term: term})
	var res TermBumpResponse
	_, err := c.send(ctx, http.MethodPost, TimelinePath(key)+"/term_bump", b, &res)
	return &res, err
}

// PullTimeline is POST /v1/pull_timeline: the safekeeper copies the
// timeline from the peer at from (host:port of its PostgreSQL protocol).
func (c *Client) PullTimeline(ctx context.Context, key proto.TimelineKey, from string) (*PullResponse, error) {
	b, _ := json.Marshal(PullRequest{TenantID: key.TenantID.String(), TimelineID: key.TimelineID.String(), From: from})
	var res PullResponse
	_, err := c.send(ctx, http.MethodPost, "/v1/pull_timeline", b, &res)
	return &res, err
}

// request is a request to path with the token.
func (c *Client) request(ctx context.Context, method, path string) (*http.Request, error) {
	return c.requestBody(ctx, method, path, nil)
}

func (c *Client) requestBody(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// Do sends method path and decodes a 200 answer's JSON into v; it returns
// the raw body too.
func (c *Client) Do(ctx context.Context, method, path string, v any) ([]byte, error) {
	return c.send(ctx, method, path, nil, v)
}

// send is Do with a JSON request body (nil: none).
func (c *Client) send(ctx context.Context, method, path string, reqBody []byte, v any) ([]byte, error) {
	req, err := c.requestBody(ctx, method, path, reqBody)
	if err != nil {
		return nil, err
	}
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	url := req.URL.String()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.unreachable(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, c.errorAnswer(method, url, resp, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // ids and sizes print as written, not as floats
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	return body, nil
}

// walChunk is how much WAL one delivery of WAL holds at most.
const walChunk = 1 << 20

// WAL reads a timeline's WAL [from, to) from GET .../wal and hands it to
// deliver in order, in pieces of up to 1 MiB. A range the server holds
// only in part, or an answer cut short, is an error.
func (c *Client) WAL(ctx context.Context, key proto.TimelineKey, from, to proto.LSN, deliver func([]byte) error) error {
	q := url.Values{"start": {from.String()}, "end": {to.String()}}
	req, err := c.request(ctx, http.MethodGet, TimelinePath(key)+"/wal?"+q.Encode())
	if err != nil {
		return err
	}
	u := req.URL.String()
	resp, err := c.http.Do(req)
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return c.errorAnswer(http.MethodGet, u, resp, body)
	}
	if got := resp.Header.Get(WALStartHeader); got != from.String() {
		return fmt.Errorf("GET %s: the server sent WAL from %q, not %s", u, got, from)
	}
	buf := make([]byte, walChunk)
	pos := from
	for {
		n, err := io.ReadFull(resp.Body, buf)
		if n > 0 {
			if ferr := deliver(buf[:n]); ferr != nil {
				return ferr
			}
			pos += proto.LSN(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading WAL at %s from %s: %w", pos, c.addr, err)
		}
	}
	if pos < to {
		if end := resp.Header.Get(WALEndHeader); end != to.String() {
			return fmt.Errorf("the server had WAL only up to %s, not %s", end, to)
		}
		return fmt.Errorf("the WAL stream from %s ended at %s, before %s", c.addr, pos, to)
	}
	return nil
}

// unreachable is the error for a request that got no answer. A plain
// request that the server closed without one may have gone to an HTTPS
// port (Go's server answers only requests that start with GET, HEAD, POST,
// PUT or OPTIONS with a 400 that says so): the error says what to try.
func (c *Client) unreachable(err error) error {
	err = fmt.Errorf("cannot reach the safekeeper's HTTP API at %s: %w", c.addr, err)
	if strings.HasPrefix(c.base, "http://") && errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w; if it serves HTTPS, use --http https://%s (with --http-cacert CA.pem unless the system trusts its certificate)", err, strings.TrimPrefix(c.base, "http://"))
	}
	// net/http says so only in words (transport.go, a TLS record header
	// that reads as HTTP).
	if host, ok := strings.CutPrefix(c.base, "https://"); ok && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		err = fmt.Errorf("%w; it serves plain HTTP there (no --tls-cert): use --http %s", err, host)
	}
	return err
}

// ErrHTTPS is wrapped by the error of a plain HTTP request that the
// server answered as an HTTPS port does (see HTTPSError).
var ErrHTTPS = errors.New("httpapi: the API serves HTTPS")

// HTTPSError is the error of a plain HTTP request to the API's HTTPS
// port: Addr is the address as given, Host its host:port (to use with
// https://).
type HTTPSError struct{ Addr, Host string }

func (e *HTTPSError) Error() string {
	return fmt.Sprintf("%s: the safekeeper's HTTP API serves HTTPS there: use https://%s", e.Addr, e.Host)
}

func (e *HTTPSError) Unwrap() error { return ErrHTTPS }

// maxErrorBody is how much of an error answer's body that is not the API's
// JSON an error shows.
const maxErrorBody = 200

// errorAnswer is the one-line error for an HTTP answer other than 200: the
// API's own ErrorBody, else the status and the start of the body (a
// proxy's page, another server); a plain HTTP request to the API's HTTPS
// port is an *HTTPSError.
func (c *Client) errorAnswer(method, url string, resp *http.Response, body []byte) error {
	var e ErrorBody
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("%s (HTTP %d %s)", e.Error, resp.StatusCode, e.Code)
	}
	// Go's HTTPS server answers a plain request so (net/http.Server.serve).
	if resp.StatusCode == http.StatusBadRequest && strings.HasPrefix(c.base, "http://") &&
		bytes.Contains(body, []byte("Client sent an HTTP request to an HTTPS server")) {
		return &HTTPSError{Addr: c.addr, Host: strings.TrimPrefix(c.base, "http://")}
	}
	msg := fmt.Sprintf("%s %s: HTTP %s", method, url, resp.Status)
	if b := oneLine(body, maxErrorBody); b != "" {
		msg += ": " + b
	}
	return errors.New(msg)
}

// oneLine is b as one line of at most max bytes (then "..."): spaces
// trimmed, every run of control characters and blanks made one space,
// invalid UTF-8 replaced.
func oneLine(b []byte, max int) string {
	s := strings.Join(strings.FieldsFunc(strings.ToValidUTF8(string(b), "\ufffd"), func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
