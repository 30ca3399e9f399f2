package testbed

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

const (
	// minioStartTimeout bounds a MinIO server's start, until it is live.
	minioStartTimeout = time.Minute
	// minioCallTimeout bounds one S3 call of the harness.
	minioCallTimeout = 30 * time.Second
)

// MinIORegion is the region of the test bed's MinIO servers. They enforce
// it: a request signed for another region is refused, so a spec that stores
// a repository proves the BSLS's region reached Kopia.
const MinIORegion = "us-east-1"

// MinIO is a running MinIO server on loopback, speaking plain HTTP: the S3
// endpoint of the specs that keep repositories in a bucket.
type MinIO struct {
	// Endpoint is host:port, as S3 clients and the BSLS's spec.storage.s3
	// name it; URL is http://<Endpoint>.
	Endpoint string
	URL      string
	// AccessKeyID and SecretAccessKey are the server's root credentials.
	AccessKeyID     string
	SecretAccessKey string
	// DataDir is where the server keeps its buckets.
	DataDir string
	// Process is the running server; its log is printed when the test fails.
	Process *Process

	client *minio.Client
	// spec and dir start the server again (Restart).
	spec ProcessSpec
	dir  string
}

// StartMinIO runs `minio server` on a free 127.0.0.1 port, with its console
// off and bound to loopback too, and random root credentials passed in the
// environment only. It returns once /minio/health/live answers; the test's
// cleanup stops the server.
func StartMinIO(tb TB) *MinIO {
	tb.Helper()
	tools := MustTools(tb)
	dir := tb.TempDir()
	ports := make([]int, 2)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			tb.Fatalf("%v", err)
		}
		ports[i] = p
	}
	if ports[0] == ports[1] {
		tb.Fatalf("MinIO: the API and console were given the same port %d", ports[0])
	}
	m := &MinIO{
		Endpoint:        "127.0.0.1:" + strconv.Itoa(ports[0]),
		AccessKeyID:     "testbed-" + RandomPassword()[:12],
		SecretAccessKey: RandomPassword(),
		DataDir:         filepath.Join(dir, "data"),
	}
	m.URL = "http://" + m.Endpoint
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(m.AccessKeyID, m.SecretAccessKey, ""),
		Secure: false,
		Region: MinIORegion,
	})
	if err != nil {
		tb.Fatalf("MinIO client for %s: %v", m.Endpoint, err)
	}
	m.client = client

	m.spec = ProcessSpec{
		Name: "minio-" + strconv.Itoa(ports[0]),
		Path: tools.MinIO,
		Args: []string{
			"server",
			"--address=" + m.Endpoint,
			"--console-address=127.0.0.1:" + strconv.Itoa(ports[1]),
			"--certs-dir=" + filepath.Join(dir, "certs"),
			// No credentials in the log, whatever the terminal.
			"--anonymous",
			m.DataDir,
		},
		Env: []string{
			"MINIO_ROOT_USER=" + m.AccessKeyID,
			"MINIO_ROOT_PASSWORD=" + m.SecretAccessKey,
			"MINIO_REGION=" + MinIORegion,
			"MINIO_BROWSER=off",
			"MINIO_UPDATE=off",
		},
		Dir: filepath.Join(dir, "home"),
	}
	m.dir = dir
	if m.Process, err = startProcess(dir, m.spec); err != nil {
		tb.Fatalf("%v", err)
	}
	// Whichever process runs then: Restart replaces it.
	tb.Cleanup(func() {
		m.Process.Stop()
		if tb.Failed() {
			tb.Logf("%s log (%s):\n%s", m.spec.Name, m.Process.LogPath, tail(m.Process.LogPath, 60))
		}
	})
	if err := m.waitReady(); err != nil {
		tb.Fatalf("MinIO at %s: %v\n%s", m.URL, err, tail(m.Process.LogPath, 40))
	}
	return m
}

// Restart starts a stopped server (m.Process.Stop: a storage outage) again
// on the same address, with the same credentials and data, and returns
// once it answers S3 calls; the cleanup of StartMinIO's test stops it.
func (m *MinIO) Restart() error {
	m.Process.Stop()
	p, err := startProcess(m.dir, m.spec)
	if err != nil {
		return err
	}
	m.Process = p
	if err := m.waitReady(); err != nil {
		return fmt.Errorf("MinIO at %s, restarted: %w\n%s", m.URL, err, tail(m.Process.LogPath, 40))
	}
	return nil
}

// waitReady polls /minio/health/live until the server is live with its
// object layer up (live answers 200 before that, flagged "offline"), then
// /minio/health/cluster until IAM and bucket metadata are loaded too, so
// that the first S3 call succeeds.
func (m *MinIO) waitReady() error {
	health := &http.Client{Timeout: 2 * time.Second}
	check := func(path string) error {
		resp, err := health.Get(m.URL + path)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s (%s)", path, resp.Status, resp.Header.Get(minioStatusHeader))
		}
		if status := resp.Header.Get(minioStatusHeader); status != "" {
			return fmt.Errorf("GET %s: server status %s", path, status)
		}
		return nil
	}
	return WaitFor(minioStartTimeout, 100*time.Millisecond, func() (bool, error) {
		if exited, err := m.Process.Exited(); exited {
			return false, fmt.Errorf("minio exited: %v", err)
		}
		for _, path := range []string{"/minio/health/live", "/minio/health/cluster"} {
			if err := check(path); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// minioStatusHeader is set on health answers while the server is not up.
const minioStatusHeader = "X-Minio-Server-Status"

// CreateBucket creates a bucket in the server's region.
func (m *MinIO) CreateBucket(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), minioCallTimeout)
	defer cancel()
	if err := m.client.MakeBucket(ctx, name, minio.MakeBucketOptions{Region: MinIORegion}); err != nil {
		return fmt.Errorf("create bucket %s at %s: %w", name, m.URL, err)
	}
	return nil
}

// Objects lists the keys of the objects under prefix in bucket, sorted.
func (m *MinIO) Objects(bucket, prefix string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), minioCallTimeout)
	defer cancel()
	var keys []string
	for obj := range m.client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list s3://%s/%s at %s: %w", bucket, prefix, m.URL, obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	sort.Strings(keys)
	return keys, nil
}
