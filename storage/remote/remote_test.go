package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/s3test"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

func openTestDir(t *testing.T) (*Dir, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "archive")
	s, err := Open("file://"+root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s.(*Dir), root
}

// eachBackend runs test on a fresh store of each backend: a directory,
// and a prefix of a bucket on a real S3-compatible server (versitygw,
// test/s3test). dir is the directory backend's root ("" for S3).
func eachBackend(t *testing.T, test func(t *testing.T, s Storage, dir string)) {
	t.Run("dir", func(t *testing.T) {
		s, root := openTestDir(t)
		test(t, s, root)
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		srv.SetEnv(t)
		s, err := Open(srv.URL("cluster-1/archive"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		test(t, s, "")
	})
}

func readAll(t *testing.T, s Storage, name string, off, n int64) []byte {
	t.Helper()
	r, err := s.Read(context.Background(), name, off, n)
	if err != nil {
		t.Fatalf("Read %s [%d, +%d): %v", name, off, n, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCreateOnce: an object is created once; a second Create of its name,
// with other bytes or the same, is ErrExists and changes nothing.
func TestCreateOnce(t *testing.T) { eachBackend(t, testCreateOnce) }

func testCreateOnce(t *testing.T, s Storage, _ string) {
	ctx := context.Background()
	name := "tenant/timeline/000000010000000000000003"
	if err := s.Create(ctx, name, []byte("first")); err != nil {
		t.Fatal(err)
	}
	for _, again := range [][]byte{[]byte("second, longer"), []byte("first")} {
		if err := s.Create(ctx, name, again); !errors.Is(err, ErrExists) {
			t.Fatalf("second Create: %v, want ErrExists", err)
		}
	}
	if got := readAll(t, s, name, 0, -1); string(got) != "first" {
		t.Fatalf("object holds %q after a refused Create, want %q", got, "first")
	}
	o, err := s.Stat(ctx, name)
	if err != nil || o.Size != 5 || o.Name != name {
		t.Fatalf("Stat: %+v, %v", o, err)
	}
}

// TestConcurrentCreatesOneWins: writers racing to create one name with
// different bytes: exactly one succeeds, and the object holds its bytes.
func TestConcurrentCreatesOneWins(t *testing.T) { eachBackend(t, testConcurrentCreatesOneWins) }

func testConcurrentCreatesOneWins(t *testing.T, s Storage, _ string) {
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Create(context.Background(), "x/segment", bytes.Repeat([]byte{byte('a' + i)}, 1<<20))
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("writers %d and %d both created the object", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, ErrExists):
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer created the object")
	}
	if got := readAll(t, s, "x/segment", 0, -1); !bytes.Equal(got, bytes.Repeat([]byte{byte('a' + winner)}, 1<<20)) {
		t.Fatal("the object does not hold the winner's bytes")
	}
}

// openThroughProxy opens a prefix of a fresh S3 server through a
// FaultProxy.
func openThroughProxy(t *testing.T, prefix string) (Storage, *s3test.FaultProxy) {
	t.Helper()
	srv := s3test.Start(t)
	srv.SetEnv(t)
	proxy := s3test.StartFaultProxy(t, srv)
	s, err := Open(proxy.URL(srv, prefix), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, proxy
}

// TestS3CreateWhoseAnswerIsLost: a PUT the store acted on but whose answer
// never came back (the connection closed): the store's content decides.
// The writer's own bytes there are a success, other bytes ErrExists; a
// store that got nothing is ErrUnavailable.
func TestS3CreateWhoseAnswerIsLost(t *testing.T) {
	s, proxy := openThroughProxy(t, "lost")
	ctx := context.Background()
	proxy.Set(s3test.LosePutAnswer)
	if err := s.Create(ctx, "a", []byte("mine")); err != nil {
		t.Fatalf("Create whose answer was lost: %v, want success (the store holds its bytes)", err)
	}
	if err := s.Create(ctx, "a", []byte("other")); !errors.Is(err, ErrExists) {
		t.Fatalf("Create of other bytes whose answer was lost: %v, want ErrExists", err)
	}
	if proxy.Seen(s3test.LosePutAnswer) < 2 {
		t.Fatal("the proxy lost no answer")
	}
	if got := readAll(t, s, "a", 0, -1); string(got) != "mine" {
		t.Fatalf("object holds %q, want %q", got, "mine")
	}
	proxy.Set(s3test.Drop)
	if err := s.Create(ctx, "b", []byte("never stored")); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrExists) {
		t.Fatalf("Create the store never got: %v, want ErrUnavailable", err)
	}
}

// TestReadRanges: a range of an object, to its end, empty at its end; an
// offset past it and a missing object are errors.
func TestReadRanges(t *testing.T) { eachBackend(t, testReadRanges) }

func testReadRanges(t *testing.T, s Storage, _ string) {
	ctx := context.Background()
	if err := s.Create(ctx, "o", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int64
		want   string
	}{{0, -1, "0123456789"}, {3, 4, "3456"}, {7, -1, "789"}, {7, 100, "789"}, {10, -1, ""}, {10, 5, ""}} {
		if got := readAll(t, s, "o", c.off, c.n); string(got) != c.want {
			t.Errorf("Read(%d, %d) = %q, want %q", c.off, c.n, got, c.want)
		}
	}
	if _, err := s.Read(ctx, "o", 11, 1); err == nil {
		t.Error("Read past the end succeeded")
	}
	if _, err := s.Read(ctx, "missing", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Errorf("Read of a missing object: %v, want ErrNotFound", err)
	}
	if _, err := s.Stat(ctx, "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stat of a missing object: %v, want ErrNotFound", err)
	}
}

// TestListInNameOrder: List gives the objects under a prefix in byte order
// of their names (not a directory walk's order), and never a temporary
// file; Delete removes an object, and deleting a missing one is no error.
func TestListInNameOrder(t *testing.T) { eachBackend(t, testListInNameOrder) }

func testListInNameOrder(t *testing.T, s Storage, root string) {
	ctx := context.Background()
	names := []string{"a/b", "a.b", "a/c/d", "b", "ab/x"}
	for _, n := range names {
		if err := s.Create(ctx, n, []byte(n)); err != nil {
			t.Fatal(err)
		}
	}
	// What a crash in the middle of a directory's Create leaves: a
	// temporary file.
	if root != "" {
		if err := os.WriteFile(filepath.Join(root, "a", ".b2.tmp-0011223344556677"), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	list := func(prefix string) string {
		var got []string
		if err := s.List(ctx, prefix, func(o Object) error {
			if o.Size != int64(len(o.Name)) {
				t.Errorf("%s: size %d", o.Name, o.Size)
			}
			got = append(got, o.Name)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return strings.Join(got, " ")
	}
	for prefix, want := range map[string]string{
		"": "a.b a/b a/c/d ab/x b", "a": "a.b a/b a/c/d ab/x", "a/": "a/b a/c/d", "a/c": "a/c/d", "a/c/": "a/c/d", "zz/": "", "a/b": "a/b",
	} {
		if got := list(prefix); got != want {
			t.Errorf("List(%q) = %q, want %q", prefix, got, want)
		}
	}
	if err := s.Delete(ctx, "a/b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a/b"); err != nil {
		t.Fatalf("deleting a missing object: %v", err)
	}
	if got := list("a/"); got != "a/c/d" {
		t.Errorf("after Delete: List(a/) = %q", got)
	}
	stop := errors.New("stop")
	if err := s.List(ctx, "", func(Object) error { return stop }); err != stop {
		t.Errorf("List returned %v, want the callback's error", err)
	}
}

// TestBadNamesAndURLs: names that are not clean relative keys, and URLs
// this build cannot use, are refused with their own errors.
func TestBadNamesAndURLs(t *testing.T) {
	s, _ := openTestDir(t)
	for _, name := range []string{"", "/abs", "a//b", "../x", "a/../b", "a/./b", ".hidden", "a/.tmp", "a\\b", "a\nb", "a/", strings.Repeat("x", 1025)} {
		if err := s.Create(context.Background(), name, nil); !errors.Is(err, ErrBadName) {
			t.Errorf("Create(%q): %v, want ErrBadName", name, err)
		}
	}
	for _, u := range []string{"", "/var/archive", "file:relative/path", "file://otherhost/path", "file:///tmp/x?opt=1", "ftp://h/p", "%zz",
		"s3:///prefix", "s3://user:secret@bucket/p", "s3://bucket/p?endpoint=ftp://h", "s3://bucket/p?endpoint=http://h/path",
		"s3://bucket/p?acl=public", "s3://bucket/a//b"} {
		if _, err := Open(u, Options{}); !errors.Is(err, ErrBadURL) {
			t.Errorf("Open(%q): %v, want ErrBadURL", u, err)
		}
	}
}

// TestKilledCreateLeavesNoPartialObject: a process killed (SIGKILL) while
// it creates objects leaves each of them whole or absent: every object
// listed afterwards holds exactly the bytes its writer meant.
func TestKilledCreateLeavesNoPartialObject(t *testing.T) {
	if root := os.Getenv("REMOTE_TEST_WRITER_ROOT"); root != "" {
		writeForever(root)
		return
	}
	root := filepath.Join(t.TempDir(), "archive")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledCreateLeavesNoPartialObject$")
	cmd.Env = append(os.Environ(), "REMOTE_TEST_WRITER_ROOT="+root)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	s, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	count := func() int {
		n := 0
		s.List(ctx, "", func(Object) error { n++; return nil })
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for count() < 3 { // polled: the writer is another process
		if time.Now().After(deadline) {
			t.Fatal("the writer created no objects")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// What the kill interrupted is gone or whole; read every object.
	n := 0
	if err := s.List(ctx, "", func(o Object) error {
		n++
		if got := readAll(t, s, o.Name, 0, -1); !bytes.Equal(got, objectBytes(o.Name)) {
			t.Errorf("%s: %d bytes, not what its writer wrote (%d bytes)", o.Name, len(got), len(objectBytes(o.Name)))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d objects whole after the writer was killed", n)
}

// objectBytes is what the writer stores as name: 4 MiB derived from it.
func objectBytes(name string) []byte {
	seed := sha256.Sum256([]byte(name))
	return bytes.Repeat(seed[:], (4<<20)/len(seed))
}

func writeForever(root string) {
	s, err := NewDir(root)
	if err != nil {
		panic(err)
	}
	for i := 0; ; i++ {
		name := fmt.Sprintf("t/%08d", i)
		if err := s.Create(context.Background(), name, objectBytes(name)); err != nil {
			panic(err)
		}
	}
}

// TestS3CheckNamesTheProblem: Check against a real S3 server tells a
// missing bucket and refused credentials apart, and accepts the right
// ones.
func TestS3CheckNamesTheProblem(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	check := func(raw string) error {
		t.Helper()
		s, err := Open(raw, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Check(ctx)
	}
	if err := check(srv.URL("p")); err != nil {
		t.Fatalf("good bucket and credentials: %v", err)
	}
	wrongBucket := strings.Replace(srv.URL("p"), "s3://"+srv.Bucket+"/", "s3://no-such-bucket/", 1)
	if err := check(wrongBucket); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `bucket "no-such-bucket" does not exist`) {
		t.Errorf("missing bucket: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
	if err := check(srv.URL("p")); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "credentials refused") {
		t.Errorf("wrong secret: %v", err)
	}
	// A credentials file names them instead of the environment.
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	file := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(file, []byte("[default]\naws_access_key_id = "+srv.AccessKey+"\naws_secret_access_key = "+srv.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(srv.URL("p"), Options{CredentialsFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("credentials file: %v", err)
	}
	// A store that is down is unavailable, not refused: it may come back.
	srv.Stop()
	if err := check(srv.URL("p")); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		t.Errorf("store down: %v, want ErrUnavailable only", err)
	}
	if _, err := Open(srv.URL("p"), Options{CredentialsFile: file + ".missing"}); !errors.Is(err, ErrBadURL) {
		t.Errorf("missing credentials file: %v", err)
	}
}

// TestS3CreateOfBytesDamagedOnTheWay: a body damaged between the writer
// and the store (a byte flipped by a proxy, on plain HTTP where no TLS
// record would catch it) is refused by the store against the checksum
// the request carries, and nothing is stored.
func TestS3CreateOfBytesDamagedOnTheWay(t *testing.T) {
	s, proxy := openThroughProxy(t, "damaged")
	ctx := context.Background()
	proxy.Set(s3test.CorruptPut)
	data := bytes.Repeat([]byte("WAL "), 1<<18)
	err := s.Create(ctx, "a", data)
	if err == nil || errors.Is(err, ErrExists) {
		t.Fatalf("Create of a body damaged on the way: %v, want an error", err)
	}
	if proxy.Seen(s3test.CorruptPut) == 0 {
		t.Fatalf("the proxy damaged nothing (Create: %v)", err)
	}
	proxy.Set(s3test.Pass)
	if _, err := s.Stat(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat after the damaged Create: %v, want ErrNotFound", err)
	}
	if err := s.Create(ctx, "a", data); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, "a", 0, -1); !bytes.Equal(got, data) {
		t.Fatal("the object does not hold the bytes written")
	}
}

// TestS3OverTLS: an https endpoint signed by a private authority is
// reached with AWS_CA_BUNDLE naming that authority; with another
// authority's bundle the handshake is refused and the store is
// unavailable (not silently trusted); a bundle that cannot be read or
// holds no certificate is a bad configuration at Open.
func TestS3OverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	other := tlstest.NewCA(t, t.TempDir())
	certFile, keyFile := filepath.Join(dir, "s3.crt"), filepath.Join(dir, "s3.key")
	ca.Issue(t, "versitygw", certFile, keyFile)
	srv := s3test.StartWith(t, s3test.Options{CertFile: certFile, KeyFile: keyFile})
	srv.SetEnv(t)
	if !strings.HasPrefix(srv.Endpoint, "https://") {
		t.Fatalf("endpoint %s: want https", srv.Endpoint)
	}
	ctx := context.Background()

	t.Setenv("AWS_CA_BUNDLE", ca.CertFile)
	s, err := Open(srv.URL("tls"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check with the server's authority: %v", err)
	}
	if err := s.Create(ctx, "a", []byte("over TLS")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, "a", 0, -1); string(got) != "over TLS" {
		t.Fatalf("read %q", got)
	}

	t.Setenv("AWS_CA_BUNDLE", other.CertFile)
	s, err = Open(srv.URL("tls"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.Stat(ctx2, "a"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Stat with another authority's bundle: %v, want ErrUnavailable naming the certificate", err)
	}

	t.Setenv("AWS_CA_BUNDLE", filepath.Join(dir, "missing.pem"))
	if _, err := Open(srv.URL("tls"), Options{}); !errors.Is(err, ErrBadURL) {
		t.Fatalf("Open with a missing bundle: %v, want ErrBadURL", err)
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_CA_BUNDLE", empty)
	if _, err := Open(srv.URL("tls"), Options{}); !errors.Is(err, ErrBadURL) || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("Open with a bundle holding no certificate: %v, want ErrBadURL", err)
	}
}
