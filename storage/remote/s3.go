package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Storage in an S3 bucket, on AWS or any S3-compatible server
// (s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=R). Objects are
// keys under PREFIX. Create is a single PUT with If-None-Match: * (S3's
// conditional write), so the store itself refuses a second object of a
// name, even from two writers racing; the body travels with its CRC32C,
// so bytes damaged on the way are refused too.
//
// The client is minio-go v7: one small module with S3's conditional
// writes, ranged reads and the AWS credential chain, where aws-sdk-go-v2
// brings a dozen modules (smithy, the SDK's config loader) for the five
// calls used here.
type S3 struct {
	client   *minio.Client
	core     minio.Core
	bucket   string
	prefix   string // "" or ending in "/"
	endpoint string // as given in the URL ("" for AWS)
	region   string
}

// s3Schemes are the URL options an s3:// URL takes.
var s3Options = map[string]bool{"endpoint": true, "region": true}

// openS3 returns the store an s3:// URL names. Credentials come from
// o.CredentialsFile (an AWS shared credentials file, profile AWS_PROFILE or
// "default") when set; otherwise from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, then the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials),
// then, on AWS only, the instance's IAM role. The region is the URL's
// region option, else AWS_REGION, else us-east-1. An https endpoint's
// certificate is checked against the authorities in AWS_CA_BUNDLE when it
// is set (and those only, as the AWS CLI and SDKs do), else the system's.
func openS3(raw string, u *url.URL, o Options) (*S3, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrBadURL, redact(raw), fmt.Sprintf(format, args...))
	}
	if u.User != nil {
		return nil, bad("credentials do not go in the URL: use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --remote-storage-credentials-file")
	}
	if u.Host == "" {
		return nil, bad("no bucket (s3://BUCKET/PREFIX)")
	}
	q := u.Query()
	for k := range q {
		if !s3Options[k] {
			return nil, bad("unknown option %q (s3 URLs take endpoint and region)", k)
		}
	}
	s := &S3{bucket: u.Host, endpoint: q.Get("endpoint"), region: q.Get("region")}
	if p := strings.Trim(u.Path, "/"); p != "" {
		if err := CheckName(p); err != nil {
			return nil, bad("prefix: %v", err)
		}
		s.prefix = p + "/"
	}
	if s.region == "" {
		s.region = os.Getenv("AWS_REGION")
	}
	if s.region == "" {
		s.region = "us-east-1"
	}
	host, secure := "s3.amazonaws.com", true
	lookup := minio.BucketLookupAuto
	if s.endpoint != "" {
		eu, err := url.Parse(s.endpoint)
		if err != nil || eu.Host == "" || (eu.Path != "" && eu.Path != "/") || eu.RawQuery != "" {
			return nil, bad("endpoint %q: give a URL such as http://127.0.0.1:7070", s.endpoint)
		}
		switch eu.Scheme {
		case "http":
			secure = false
		case "https":
		default:
			return nil, bad("endpoint %q: scheme must be http or https", s.endpoint)
		}
		host = eu.Host
		// S3-compatible servers are addressed path-style
		// (http://host/bucket/key): they seldom have the wildcard DNS
		// that virtual-host style needs.
		lookup = minio.BucketLookupPath
	}
	var creds *credentials.Credentials
	if o.CredentialsFile != "" {
		if _, err := os.Stat(o.CredentialsFile); err != nil {
			return nil, fmt.Errorf("%w: credentials file: %v", ErrBadURL, err)
		}
		creds = credentials.NewFileAWSCredentials(o.CredentialsFile, "")
	} else {
		providers := []credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}}
		if s.endpoint == "" {
			providers = append(providers, &credentials.IAM{})
		}
		creds = credentials.NewChainCredentials(providers)
	}
	tr, err := s3Transport(secure)
	if err != nil {
		return nil, err
	}
	s.client, err = minio.New(host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Region:       s.region,
		BucketLookup: lookup,
		Transport:    tr,
		// Callers retry on their own schedule (the uploader backs off and
		// says why); a few quick retries here ride out a dropped
		// connection without hiding an outage for minutes.
		MaxRetries: 3,
		// Lets Create send its x-amz-checksum-crc32c header (minio-go
		// allows checksum headers only with this set); the client then
		// adds no checksum of its own to a PUT that carries one.
		TrailingHeaders: true,
	})
	if err != nil {
		return nil, bad("%v", err)
	}
	s.core = minio.Core{Client: s.client}
	return s, nil
}

// redact drops credentials from a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	u.User = nil
	return u.String()
}

func (s *S3) String() string {
	q := "?region=" + s.region
	if s.endpoint != "" {
		q = "?endpoint=" + s.endpoint + "&region=" + s.region
	}
	return "s3://" + s.bucket + "/" + strings.TrimSuffix(s.prefix, "/") + q
}

func (s *S3) key(name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	return s.prefix + name, nil
}

// s3Error turns the store's answer into this package's errors, naming the
// store and the object.
func (s *S3) s3Error(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("remote: %s %s in %s: %w", op, name, s, err)
	}
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case "NoSuchKey":
		return fmt.Errorf("%w: %s in %s", ErrNotFound, name, s)
	case "PreconditionFailed":
		return fmt.Errorf("%w: %s in %s", ErrExists, name, s)
	case "NoSuchBucket":
		return fmt.Errorf("%w: %w: %s %s: bucket %q does not exist", ErrUnavailable, ErrRefused, op, s, s.bucket)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken":
		return fmt.Errorf("%w: %w: %s %s in %s: credentials refused (%s): %v", ErrUnavailable, ErrRefused, op, name, s, r.Code, err)
	}
	return fmt.Errorf("%w: %s %s in %s: %v", ErrUnavailable, op, name, s, err)
}

func (s *S3) Create(ctx context.Context, name string, data []byte) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	// The body's integrity on the way: its CRC32C in
	// x-amz-checksum-crc32c, which the store checks before it keeps the
	// object (and keeps with it). It costs a fraction of the Content-MD5
	// or the signed SHA-256 of the payload it replaces (CRC32C is one
	// instruction per 8 bytes), which matters when every segment is
	// uploaded. The payload is not signed (UNSIGNED-PAYLOAD): the
	// signature covers the headers, the checksum among them.
	opts := minio.PutObjectOptions{
		ContentType:          "application/octet-stream",
		DisableMultipart:     true,
		DisableContentSha256: true,
		UserMetadata:         map[string]string{"x-amz-checksum-crc32c": crc32cBase64(data)},
	}
	opts.SetMatchETagExcept("*") // If-None-Match: *
	_, err = s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), opts)
	if err != nil && minio.ToErrorResponse(err).StatusCode == 0 && ctx.Err() == nil {
		// No answer from the store: the connection broke. A store that
		// refuses the name may answer 412 before it has read the body and
		// close the connection while the body is still on its way, so the
		// writer sees a reset, not the refusal. What the store holds
		// decides: our bytes (this PUT or an earlier one landed) are a
		// success, other bytes are ErrExists, nothing is the error.
		if got, rerr := s.whole(ctx, name); rerr == nil {
			if bytes.Equal(got, data) {
				return nil
			}
			return fmt.Errorf("%w: %s in %s", ErrExists, name, s)
		}
	}
	return s.s3Error("create", name, err)
}

// s3Transport is the HTTP transport of an S3 client: minio-go's defaults
// (no transparent gzip, a minute's response timeout) with TLS 1.2 at
// least. Its authorities are AWS_CA_BUNDLE's when that is set, as the AWS
// SDKs read it (a private CA); else the system's, which Go loads at the
// first handshake (honouring SSL_CERT_FILE and SSL_CERT_DIR). minio-go's
// own DefaultTransport parses the system's at once, and again with
// SSL_CERT_FILE set: tens of milliseconds that every `wal fetch` (one
// process per segment) would pay for authorities it may never use.
func s3Transport(secure bool) (*http.Transport, error) {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   16,
		ResponseHeaderTimeout: time.Minute,
		IdleConnTimeout:       time.Minute,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 10 * time.Second,
		DisableCompression:    true, // objects are handed over as stored
	}
	if !secure {
		return tr, nil
	}
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if bundle := os.Getenv("AWS_CA_BUNDLE"); bundle != "" {
		pem, err := os.ReadFile(bundle)
		if err != nil {
			return nil, fmt.Errorf("%w: AWS_CA_BUNDLE: %v", ErrBadURL, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: AWS_CA_BUNDLE %s holds no PEM certificate", ErrBadURL, bundle)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return tr, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32cBase64 is data's CRC32C as S3's checksum headers carry it: the
// four bytes big-endian, in base64.
func crc32cBase64(data []byte) string {
	return base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, crc32.Checksum(data, castagnoli)))
}

// whole reads all of an object.
func (s *S3) whole(ctx context.Context, name string) ([]byte, error) {
	body, err := s.Read(ctx, name, 0, -1)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return io.ReadAll(body)
}

func (s *S3) Read(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	key, err := s.key(name)
	if err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("remote: read %s: negative offset %d", name, off)
	}
	if n == 0 {
		return s.emptyAt(ctx, name, off)
	}
	var opts minio.GetObjectOptions
	switch {
	case n > 0:
		err = opts.SetRange(off, off+n-1)
	case off > 0:
		err = opts.SetRange(off, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("remote: read %s: %v", name, err)
	}
	body, _, _, err := s.core.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "InvalidRange" {
			// A range starting at the object's end: an empty read, as
			// the interface allows; past it, an error.
			return s.emptyAt(ctx, name, off)
		}
		return nil, s.s3Error("read", name, err)
	}
	return body, nil
}

// emptyAt is an empty read at off, which must be within the object.
func (s *S3) emptyAt(ctx context.Context, name string, off int64) (io.ReadCloser, error) {
	o, err := s.Stat(ctx, name)
	if err != nil {
		return nil, err
	}
	if off > o.Size {
		return nil, fmt.Errorf("remote: read %s at %d: the object has %d bytes", name, off, o.Size)
	}
	return io.NopCloser(strings.NewReader("")), nil
}

func (s *S3) Stat(ctx context.Context, name string) (Object, error) {
	key, err := s.key(name)
	if err != nil {
		return Object{}, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if r := minio.ToErrorResponse(err); r.StatusCode == http.StatusNotFound && r.Code != "NoSuchBucket" {
			return Object{}, fmt.Errorf("%w: %s in %s", ErrNotFound, name, s)
		}
		return Object{}, s.s3Error("stat", name, err)
	}
	return Object{Name: name, Size: info.Size, Modified: info.LastModified}, nil
}

func (s *S3) List(ctx context.Context, prefix string, fn func(Object) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn ends it early
	for info := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if info.Err != nil {
			return s.s3Error("list", prefix+"*", info.Err)
		}
		name := strings.TrimPrefix(info.Key, s.prefix)
		if CheckName(name) != nil {
			continue // not an object this package wrote
		}
		if err := fn(Object{Name: name, Size: info.Size, Modified: info.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *S3) Delete(ctx context.Context, name string) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	err = s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return nil
	}
	return s.s3Error("delete", name, err)
}

// Check asks the store whether the bucket exists and the credentials are
// accepted, and writes, reads and deletes a probe object under the prefix.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return s.s3Error("check", "bucket "+s.bucket, err)
	}
	if !ok {
		return fmt.Errorf("%w: %w: %s: bucket %q does not exist", ErrUnavailable, ErrRefused, s, s.bucket)
	}
	return probe(ctx, s)
}
