package sessiongate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// The data path benchmark's sizes. GUESTBACKUP_DATAPATH_MIB and
// GUESTBACKUP_DATAPATH_ROUNDS shrink it for a quick run (say 64 and 2);
// the goals are checked only with at least two rounds, which measure the
// noise.
const (
	dataPathMiB    = 512
	dataPathRounds = 3
	// dataPathFiles is how many files a round's tree holds.
	dataPathFiles = 16
	// dataPathGuests upload at once in the concurrent figure, each
	// 1/dataPathGuests of the size (64 MiB of 512).
	dataPathGuests = 8
)

// dataPathGoals are issue 49's goals, product ÷ plain Kopia server: at
// most these for times and CPU, at least this for the concurrent
// throughput.
const (
	goalSnapshotRatio   = 1.10
	goalRestoreRatio    = 1.10
	goalCPURatio        = 1.15
	goalConcurrentRatio = 0.90
)

// dataPath is one way a guest's kopia reaches the repository.
type dataPath int

const (
	// direct: kopia connected to the storage itself.
	direct dataPath = iota
	// plain: a plain `kopia server start` with TLS on loopback.
	plain
	// product: the session gate in front of that server, with the write
	// guard a server pod runs.
	product
)

func (p dataPath) String() string { return [...]string{"direct", "plain server", "guestbackup"}[p] }

// roundFigures is what one round measured of one path.
type roundFigures struct {
	snapshot, restore time.Duration
	// snapshotCPU and restoreCPU are the server side's CPU (the Kopia
	// server's, and the gate's on the product path); none on the direct
	// path.
	snapshotCPU, restoreCPU time.Duration
	// gateCPU is the gate's part of snapshotCPU, on the product path.
	gateCPU time.Duration
	// concurrent is the wall time of dataPathGuests uploads at once; none
	// on the direct path.
	concurrent time.Duration
}

// BenchmarkDataPath is issue 49's side-by-side measure of the guest's data
// path: a kopia CLI snapshotting fresh random files, then a fresh client
// restoring them (checked byte for byte), straight to the storage, through
// a plain Kopia server, and through the gate in front of one, on a
// filesystem repository and on S3 (MinIO). It prints each figure as the
// product's ratio to the plain server and fails the run when one misses
// its goal by more than the run's noise (see checkGoals).
func BenchmarkDataPath(b *testing.B) {
	testbed.RequireTestBed(b)
	size := int64(envInt(b, "GUESTBACKUP_DATAPATH_MIB", dataPathMiB)) << 20
	rounds := envInt(b, "GUESTBACKUP_DATAPATH_ROUNDS", dataPathRounds)
	for _, storage := range []string{"filesystem", "s3"} {
		b.Run(storage, func(b *testing.B) {
			bed := startDataPathBed(b, storage)
			var figures map[dataPath][]roundFigures
			for b.Loop() {
				figures = bed.measure(b, size, rounds)
			}
			s := summarize(figures, size)
			s.report(b, storage, size, rounds)
			s.checkGoals(b, rounds)
		})
	}
}

// envInt is the positive integer in environment variable name, else def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// dataPathBed is one repository, the Kopia server that serves it, the
// gate in front of that server, and the guests of each path.
type dataPathBed struct {
	// server serves the plain path, and the product's behind the gate.
	server  *testbed.KopiaServer
	gateURL string
	// storageArgs and storageEnv connect a client to the storage itself.
	storageArgs []string
	storageEnv  []string
	dir         string
	// guests are, for each path, the one guest of the single-stream
	// figures followed by dataPathGuests of the concurrent one.
	guests map[dataPath][]*guest
}

// guest is a kopia client with its configuration, and what it connects
// with.
type guest struct {
	client   *testbed.KopiaClient
	username string
	// env carries the password, and the storage's credentials on the
	// direct path.
	env []string
	// connect connects a client as this guest.
	connect func(ctx context.Context, c *testbed.KopiaClient) error
}

func startDataPathBed(b *testing.B, storage string) *dataPathBed {
	b.Helper()
	bed := &dataPathBed{dir: b.TempDir(), guests: map[dataPath][]*guest{}}
	var opts testbed.KopiaServerOptions
	if storage == "s3" {
		m := testbed.StartMinIO(b)
		const bucket = "datapath"
		if err := m.CreateBucket(bucket); err != nil {
			b.Fatal(err)
		}
		opts.S3 = &testbed.KopiaS3{MinIO: m, Bucket: bucket}
		bed.storageArgs = []string{"s3", "--bucket=" + bucket, "--endpoint=" + m.Endpoint, "--region=" + testbed.MinIORegion, "--disable-tls"}
		bed.storageEnv = []string{"AWS_ACCESS_KEY_ID=" + m.AccessKeyID, "AWS_SECRET_ACCESS_KEY=" + m.SecretAccessKey}
	}
	bed.server = testbed.StartKopiaServer(b, opts)
	if storage != "s3" {
		bed.storageArgs = []string{"filesystem", "--path=" + bed.server.RepoPath}
	}
	// Every guest here comes from 127.0.0.1, where a cluster's come from
	// addresses of their own: the per-address bounds are not what this
	// measures.
	_, bed.gateURL = serveGate(b, bed.server, sessiongate.Options{
		Writes: &writeGuard{}, LoginsPerSource: 4 * dataPathGuests, Log: logr.Discard(),
	})

	ctx := context.Background()
	for _, p := range []dataPath{direct, plain, product} {
		for i := range 1 + dataPathGuests {
			if p == direct && i > 0 {
				break // the direct path has no server to share
			}
			g := bed.newGuest(b, p, fmt.Sprintf("vm-%d@datapath-%s", i, strings.ReplaceAll(p.String(), " ", "-")))
			g.client = testbed.NewKopiaClient(b)
			if err := g.connect(ctx, g.client); err != nil {
				b.Fatal(err)
			}
			bed.guests[p] = append(bed.guests[p], g)
		}
	}
	return bed
}

// newGuest is a guest of path p named username (user@host), added to the
// repository's users when it reaches a server.
func (bed *dataPathBed) newGuest(b *testing.B, p dataPath, username string) *guest {
	if p == direct {
		user, host, _ := strings.Cut(username, "@")
		env := append([]string{"KOPIA_PASSWORD=" + bed.server.RepoPassword}, bed.storageEnv...)
		return &guest{username: username, env: env, connect: func(ctx context.Context, c *testbed.KopiaClient) error {
			args := append(append([]string{"repository", "connect"}, bed.storageArgs...), "--override-username="+user, "--override-hostname="+host)
			if out, err := c.RunWithEnv(ctx, env, args...); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}}
	}
	password := testbed.RandomPassword()
	bed.server.AddUser(b, username, password)
	url := bed.server.URL
	if p == product {
		url = bed.gateURL
	}
	return &guest{username: username, env: []string{"KOPIA_PASSWORD=" + password}, connect: func(ctx context.Context, c *testbed.KopiaClient) error {
		if out, err := c.ConnectPinned(ctx, url, bed.server.CAPin, username, password); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}}
}

// measure runs rounds of each path, each on fresh data: in each round the
// three single-stream paths, then the concurrent uploads of both server
// paths, the plain server and the product taking turns at going first.
func (bed *dataPathBed) measure(b *testing.B, size int64, rounds int) map[dataPath][]roundFigures {
	figures := map[dataPath][]roundFigures{}
	for round := range rounds {
		order := []dataPath{direct, plain, product}
		if round%2 == 1 {
			order = []dataPath{direct, product, plain}
		}
		got := map[dataPath]*roundFigures{}
		for _, p := range order {
			f, err := bed.single(b, p, round, size)
			if err != nil {
				b.Fatalf("%s, round %d: %v", p, round, err)
			}
			got[p] = &f
		}
		for _, p := range order[1:] {
			d, err := bed.concurrent(b, p, round, size/dataPathGuests)
			if err != nil {
				b.Fatalf("%s, round %d, %d uploads at once: %v", p, round, dataPathGuests, err)
			}
			got[p].concurrent = d
		}
		for p, f := range got {
			figures[p] = append(figures[p], *f)
		}
	}
	return figures
}

// single snapshots size bytes of fresh files as p's first guest, then
// restores them with a freshly connected client and checks every byte.
func (bed *dataPathBed) single(b *testing.B, p dataPath, round int, size int64) (roundFigures, error) {
	var f roundFigures
	g := bed.guests[p][0]
	src := filepath.Join(bed.dir, fmt.Sprintf("source-%d-%d", p, round))
	if err := writeRandomTree(src, size, dataPathFiles); err != nil {
		return f, err
	}
	defer os.RemoveAll(src)
	ctx := context.Background()

	cpu := bed.startCPU(b, p)
	gate := selfCPU(b)
	start := time.Now()
	if out, err := g.client.RunWithEnv(ctx, g.env, "snapshot", "create", src); err != nil {
		return f, fmt.Errorf("snapshot: %w: %s", err, out)
	}
	f.snapshot = time.Since(start)
	f.snapshotCPU = cpu()
	if p == product {
		f.gateCPU = selfCPU(b) - gate
	}

	id, err := lastSnapshot(ctx, g, src)
	if err != nil {
		return f, err
	}
	// A guest restoring: a client of its own, so nothing comes from the
	// snapshotting client's cache.
	restorer := testbed.NewKopiaClient(b)
	if err := g.connect(ctx, restorer); err != nil {
		return f, fmt.Errorf("connect the restoring client: %w", err)
	}
	dst := filepath.Join(bed.dir, fmt.Sprintf("restore-%d-%d", p, round))
	defer os.RemoveAll(dst)
	cpu = bed.startCPU(b, p)
	start = time.Now()
	if out, err := restorer.RunWithEnv(ctx, g.env, "snapshot", "restore", id, dst); err != nil {
		return f, fmt.Errorf("restore: %w: %s", err, out)
	}
	f.restore = time.Since(start)
	f.restoreCPU = cpu()
	if err := sameTree(src, dst); err != nil {
		return f, fmt.Errorf("restored files: %w", err)
	}
	return f, nil
}

// concurrent snapshots each bytes of fresh files as each of p's
// concurrent guests at once, and returns the wall time of all.
func (bed *dataPathBed) concurrent(b *testing.B, p dataPath, round int, each int64) (time.Duration, error) {
	guests := bed.guests[p][1:]
	srcs := make([]string, len(guests))
	for i := range guests {
		srcs[i] = filepath.Join(bed.dir, fmt.Sprintf("concurrent-%d-%d-%d", p, round, i))
		if err := writeRandomTree(srcs[i], each, dataPathFiles/4); err != nil {
			return 0, err
		}
		defer os.RemoveAll(srcs[i])
	}
	var eg errgroup.Group
	start := time.Now()
	for i, g := range guests {
		eg.Go(func() error {
			if out, err := g.client.RunWithEnv(context.Background(), g.env, "snapshot", "create", srcs[i]); err != nil {
				return fmt.Errorf("%s: %w: %s", g.username, err, out)
			}
			return nil
		})
	}
	err := eg.Wait()
	return time.Since(start), err
}

// startCPU starts measuring the server side's CPU for path p, and returns
// the function that reads what it used since: the Kopia server's (from
// /proc), plus, on the product path, this process's, whose only work
// meanwhile is the gate's (the kopia clients are processes of their own).
func (bed *dataPathBed) startCPU(b *testing.B, p dataPath) func() time.Duration {
	if p == direct {
		return func() time.Duration { return 0 }
	}
	read := func() time.Duration {
		server, err := bed.server.Process.CPU()
		if err != nil {
			b.Fatalf("the Kopia server's CPU: %v", err)
		}
		if p == product {
			server += selfCPU(b)
		}
		return server
	}
	before := read()
	return func() time.Duration { return read() - before }
}

// selfCPU is this process's CPU time, user and system.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lastSnapshot is the ID of g's newest snapshot of path.
func lastSnapshot(ctx context.Context, g *guest, path string) (string, error) {
	out, err := g.client.RunWithEnv(ctx, g.env, "snapshot", "list", "--json", path)
	if err != nil {
		return "", fmt.Errorf("snapshot list: %w: %s", err, out)
	}
	var snapshots []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &snapshots); err != nil || len(snapshots) == 0 {
		return "", fmt.Errorf("snapshot list: no snapshot of %s (%v): %s", path, err, out)
	}
	return snapshots[len(snapshots)-1].ID, nil
}

// writeRandomTree writes size bytes of fresh random data into n files of
// dir: seeded anew, so nothing dedups across paths or rounds.
func writeRandomTree(dir string, size int64, n int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rand.Uint32())
	}
	src := rand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for i := range n {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("file-%02d", i)))
		if err != nil {
			return err
		}
		left := size / int64(n)
		for left > 0 && err == nil {
			chunk := buf[:min(left, int64(len(buf)))]
			_, _ = src.Read(chunk)
			_, err = f.Write(chunk)
			left -= int64(len(chunk))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write random data: %w", err)
		}
	}
	return nil
}

// sameTree is nil when dst holds exactly src's files, byte for byte.
func sameTree(src, dst string) error {
	want, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	got, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d files restored, %d snapshotted", len(got), len(want))
	}
	for _, e := range want {
		if err := sameFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
	}
	return nil
}

func sameFile(a, b string) error {
	fa, err := os.Open(a)
	if err != nil {
		return err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return err
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for offset := int64(0); ; {
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return fmt.Errorf("differs within bytes %d-%d", offset, offset+int64(max(na, nb)))
		}
		offset += int64(na)
		endA, endB := isEnd(erra), isEnd(errb)
		switch {
		case endA && endB:
			return nil
		case endA != endB:
			return fmt.Errorf("lengths differ after %d bytes", offset)
		case erra != nil:
			return erra
		case errb != nil:
			return errb
		}
	}
}

func isEnd(err error) bool { return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) }

// dataPathSummary is a run's figures: medians over its rounds, and the
// spread of the plain server's, which is the run's noise.
type dataPathSummary struct {
	// snapshot and restore are median times by path.
	snapshot, restore map[dataPath]time.Duration
	// snapshotCPU and restoreCPU are median server-side CPU seconds per
	// GiB, by server path.
	snapshotCPU, restoreCPU map[dataPath]float64
	// gateCPU is the gate's median CPU seconds per GiB uploaded.
	gateCPU float64
	// concurrent is the median aggregate MiB/s of the concurrent uploads,
	// by server path.
	concurrent map[dataPath]float64
	ratios     []ratio
}

// ratio is one of issue 49's figures, product ÷ plain server.
type ratio struct {
	name  string
	value float64
	// goal bounds value: from above, or from below when atLeast.
	goal    float64
	atLeast bool
	// noise is the spread of the plain server's figure between the
	// run's rounds, relative to its median: (max − min) ÷ median.
	noise float64
}

func summarize(figures map[dataPath][]roundFigures, size int64) dataPathSummary {
	gib := float64(size) / (1 << 30)
	s := dataPathSummary{
		snapshot: map[dataPath]time.Duration{}, restore: map[dataPath]time.Duration{},
		snapshotCPU: map[dataPath]float64{}, restoreCPU: map[dataPath]float64{}, concurrent: map[dataPath]float64{},
	}
	of := func(p dataPath, value func(roundFigures) float64) []float64 {
		var out []float64
		for _, f := range figures[p] {
			out = append(out, value(f))
		}
		return out
	}
	snapshot := func(f roundFigures) float64 { return f.snapshot.Seconds() }
	restore := func(f roundFigures) float64 { return f.restore.Seconds() }
	snapshotCPU := func(f roundFigures) float64 { return f.snapshotCPU.Seconds() / gib }
	restoreCPU := func(f roundFigures) float64 { return f.restoreCPU.Seconds() / gib }
	concurrent := func(f roundFigures) float64 { return float64(size>>20) / f.concurrent.Seconds() }
	s.gateCPU = median(of(product, func(f roundFigures) float64 { return f.gateCPU.Seconds() / gib }))
	for _, p := range []dataPath{direct, plain, product} {
		s.snapshot[p] = time.Duration(median(of(p, snapshot)) * float64(time.Second))
		s.restore[p] = time.Duration(median(of(p, restore)) * float64(time.Second))
		if p != direct {
			s.snapshotCPU[p] = median(of(p, snapshotCPU))
			s.restoreCPU[p] = median(of(p, restoreCPU))
			s.concurrent[p] = median(of(p, concurrent))
		}
	}
	figure := func(name string, value func(roundFigures) float64, goal float64, atLeast bool) ratio {
		return ratio{name: name, value: median(of(product, value)) / median(of(plain, value)),
			goal: goal, atLeast: atLeast, noise: spread(of(plain, value))}
	}
	s.ratios = []ratio{
		figure("snapshot time", snapshot, goalSnapshotRatio, false),
		figure("restore time", restore, goalRestoreRatio, false),
		figure("server CPU per GiB uploaded", snapshotCPU, goalCPURatio, false),
		figure(fmt.Sprintf("%d uploads at once, aggregate MiB/s", dataPathGuests), concurrent, goalConcurrentRatio, true),
	}
	return s
}

// report prints the run's table and reports its ratios as metrics.
func (s dataPathSummary) report(b *testing.B, storage string, size int64, rounds int) {
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("data path on %s: %d MiB of fresh random files, median of %d rounds; load average %s",
		storage, size>>20, rounds, strings.Join(strings.Fields(string(load))[:3], " "))
	mib := float64(size >> 20)
	b.Logf("  %-14s %10s %10s %12s %16s %16s %14s", "path", "snapshot", "restore", "snapshot MiB/s", "CPU-s/GiB backup", "CPU-s/GiB restore", "8 at once MiB/s")
	for _, p := range []dataPath{direct, plain, product} {
		line := fmt.Sprintf("  %-14s %9.2fs %9.2fs %12.0f", p, s.snapshot[p].Seconds(), s.restore[p].Seconds(), mib/s.snapshot[p].Seconds())
		if p != direct {
			line += fmt.Sprintf(" %16.2f %16.2f %14.1f", s.snapshotCPU[p], s.restoreCPU[p], s.concurrent[p])
		}
		b.Log(line)
	}
	b.Logf("  of guestbackup's CPU-s/GiB backup, the gate's: %.2f", s.gateCPU)
	for _, r := range s.ratios {
		bound := "≤"
		if r.atLeast {
			bound = "≥"
		}
		b.Logf("  guestbackup ÷ plain server, %s: %.2f (goal %s %.2f; noise ±%.0f%%)", r.name, r.value, bound, r.goal, 100*r.noise)
	}
	for _, p := range []dataPath{plain, product} {
		b.Logf("  sizing, %s: %.0f GiB/hour of backup, %.0f GiB/hour of restore per server core",
			p, 3600/s.snapshotCPU[p], 3600/s.restoreCPU[p])
	}
	b.ReportMetric(s.ratios[0].value, "snapshot-x")
	b.ReportMetric(s.ratios[1].value, "restore-x")
	b.ReportMetric(s.ratios[2].value, "cpu-x")
	b.ReportMetric(s.ratios[3].value, "concurrent-x")
	b.ReportMetric(s.snapshotCPU[plain], "kopia-cpu-s/GiB")
	b.ReportMetric(s.snapshotCPU[product], "gate+kopia-cpu-s/GiB")
	b.ReportMetric(s.gateCPU, "gate-cpu-s/GiB")
}

// checkGoals fails the run for each ratio that misses its goal by more
// than the run's noise: the spread of the plain server's own figure
// between rounds ((max − min) ÷ median), since the plain server is what
// the product is measured against and its rounds differ only by what else
// the machine ran. A ratio above goal × (1 + noise) (or, for a throughput,
// below goal × (1 − noise)) is a regression. One round measures no noise,
// and checks nothing.
func (s dataPathSummary) checkGoals(b *testing.B, rounds int) {
	if rounds < 2 {
		b.Logf("goals not checked: one round measures no noise")
		return
	}
	for _, r := range s.ratios {
		if r.atLeast && r.value < r.goal*(1-r.noise) {
			b.Errorf("guestbackup ÷ plain server, %s: %.2f, below its goal %.2f by more than the noise (±%.0f%%)", r.name, r.value, r.goal, 100*r.noise)
		}
		if !r.atLeast && r.value > r.goal*(1+r.noise) {
			b.Errorf("guestbackup ÷ plain server, %s: %.2f, above its goal %.2f by more than the noise (±%.0f%%)", r.name, r.value, r.goal, 100*r.noise)
		}
	}
}

// median is the median of values (of two, their mean).
func median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	v := slices.Sorted(slices.Values(values))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// spread is (max − min) ÷ median of values.
func spread(values []float64) float64 {
	m := median(values)
	if m == 0 {
		return 0
	}
	return (slices.Max(values) - slices.Min(values)) / m
}
