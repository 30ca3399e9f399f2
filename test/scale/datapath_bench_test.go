package scale

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// What BenchmarkDataPath moves: per round and path, one snapshot of
// dataPathFiles files making dataPathMiB, then parallelUploads snapshots
// at once of 1/parallelUploads of that each (64 MiB). For a quick run,
// GUESTBACKUP_DATAPATH_MIB and GUESTBACKUP_DATAPATH_ROUNDS set the size
// and the rounds (say 64 and 2); the goals are checked from two rounds.
const (
	dataPathMiB     = 512
	dataPathFiles   = 16
	dataPathRounds  = 3
	parallelUploads = 8
)

// Issue 49's goals for the product ÷ plain server ratios (dataPathGoals).
const (
	goalSnapshotRatio = 1.10
	goalRestoreRatio  = 1.10
	goalCPURatio      = 1.15
	goalParallelRatio = 0.90
)

// BenchmarkDataPath measures what a guest's backups and restores cost
// through a BSLS's server pod, beside the same kopia CLI on the same
// storage straight (how a client that holds the repository password works,
// e.g. OADP's data mover) and through a plain `kopia server start` with
// TLS on loopback (what Kanister's RepositoryServer runs): the figures of
// issue 49, as ratios taken in one run, so that a busy machine slows every
// path alike. The server pod is the product's (the controller's
// Deployment, run by the test bed's kubelet), and its guest is a VM's
// credentials as the webhook issued them.
//
// Each round writes fresh random files (nothing deduplicates across paths
// or rounds), snapshots them on each path in turn (the order rotates per
// round), restores each snapshot and checks it byte for byte, then runs
// parallelUploads snapshots at once per path. It reports the medians of
// the rounds: seconds per snapshot and restore on each path; the server
// side's CPU seconds per GiB snapshotted and per GiB restored (the plain
// server's process; the server pod's, in all and by container: the
// session gate in user-sync, Kopia's server in kopia); the aggregate MiB/s
// of the parallel uploads; and product ÷ server ratios.
//
// It fails the run when a ratio misses its goal by more than the run's
// noise (dataPathGoals).
func BenchmarkDataPath(b *testing.B) {
	testbed.RequireTestBed(b)
	scale := dataPathScale{bytes: int64(envPositive(b, "GUESTBACKUP_DATAPATH_MIB", dataPathMiB)) << 20,
		rounds: envPositive(b, "GUESTBACKUP_DATAPATH_ROUNDS", dataPathRounds)}
	for _, storage := range []string{"filesystem", "s3"} {
		b.Run(storage, func(b *testing.B) {
			for b.Loop() {
				measureDataPath(b, storage == "s3", scale)
			}
		})
	}
}

// dataPathScale is what a BenchmarkDataPath run moves: bytes per
// snapshot, in rounds.
type dataPathScale struct {
	bytes  int64
	rounds int
}

// envPositive is the positive integer environment variable name holds,
// else def.
func envPositive(b *testing.B, name string, def int) int {
	b.Helper()
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

// dataPath is one way a kopia client reaches the repository.
type dataPath struct {
	name string
	// clients are connected kopia CLIs, parallelUploads of them: the first
	// takes the serial rounds.
	clients []*testbed.KopiaClient
	// server are the processes whose CPU the path's server side spends,
	// by name (a server pod's containers); none when the client writes the
	// storage itself.
	server map[string]*testbed.Process

	// bytes is what each snapshot and restore moves.
	bytes int64

	snapshot, restore, parallel []float64
	// cpuPerGiB is the server side's CPU seconds per GiB snapshotted
	// ("snapshot") and restored ("restore"), in all and, where there are
	// several server processes, by process ("snapshot/<name>").
	cpuPerGiB map[string][]float64
}

// serverCPU is what each of the path's server processes has spent so far.
func (p *dataPath) serverCPU(b *testing.B) map[string]time.Duration {
	b.Helper()
	spent := map[string]time.Duration{}
	for name, proc := range p.server {
		cpu, err := proc.CPU()
		if err != nil {
			b.Fatalf("%s: CPU of %s: %v", p.name, name, err)
		}
		spent[name] = cpu
	}
	return spent
}

func measureDataPath(b *testing.B, s3 bool, scale dataPathScale) {
	ctx := context.Background()
	var minio *testbed.MinIO
	if s3 {
		minio = testbed.StartMinIO(b)
	}
	paths := []*dataPath{directPath(ctx, b, minio), plainServerPath(ctx, b, minio), productPath(ctx, b, minio)}
	for _, p := range paths {
		p.bytes = scale.bytes
	}
	for round := range scale.rounds {
		source, sums := randomTree(b, scale.bytes, dataPathFiles)
		// The order rotates, so no path always runs on a warmer disk.
		for i := range paths {
			p := paths[(round+i)%len(paths)]
			p.measureSerial(ctx, b, source, sums)
		}
		if err := os.RemoveAll(source); err != nil {
			b.Fatal(err)
		}
		for i := range paths {
			paths[(round+i)%len(paths)].measureParallel(ctx, b)
		}
	}
	direct, server, product := paths[0], paths[1], paths[2]
	for _, p := range paths {
		b.ReportMetric(median(p.snapshot), "snapshot-s/"+p.name)
		b.ReportMetric(median(p.restore), "restore-s/"+p.name)
		b.ReportMetric(median(p.parallel), "parallel-MiB/s/"+p.name)
	}
	for _, p := range []*dataPath{server, product} {
		for key, of := range p.cpuPerGiB {
			// server-cpu-s/GiB-snapshot/product/user-sync
			what, process, _ := strings.Cut(key, "/")
			b.ReportMetric(median(of), strings.TrimSuffix("server-cpu-s/GiB-"+what+"/"+p.name+"/"+process, "/"))
		}
	}
	b.ReportMetric(median(product.snapshot)/median(server.snapshot), "snapshot-ratio")
	b.ReportMetric(median(product.restore)/median(server.restore), "restore-ratio")
	b.ReportMetric(median(product.cpuPerGiB["snapshot"])/median(server.cpuPerGiB["snapshot"]), "cpu-ratio")
	b.ReportMetric(median(product.cpuPerGiB["restore"])/median(server.cpuPerGiB["restore"]), "restore-cpu-ratio")
	b.ReportMetric(median(product.parallel)/median(server.parallel), "parallel-ratio")
	b.Logf("per round, snapshot s: direct %v server %v product %v; restore s: direct %v server %v product %v; server CPU s/GiB: server %v product %v; %d×%d MiB at once, MiB/s: direct %v server %v product %v",
		direct.snapshot, server.snapshot, product.snapshot, direct.restore, server.restore, product.restore,
		server.cpuPerGiB, product.cpuPerGiB, parallelUploads, scale.bytes/parallelUploads>>20, direct.parallel, server.parallel, product.parallel)
	logDataPath(b, paths, scale)
	dataPathGoals(b, server, product, scale.rounds)
}

// measureSerial snapshots source through the path's first client, restores
// it and checks every file against sums.
func (p *dataPath) measureSerial(ctx context.Context, b *testing.B, source string, sums map[string][32]byte) {
	b.Helper()
	c := p.clients[0]
	p.snapshot = append(p.snapshot, p.timed(b, "snapshot", func() {
		if out, err := c.Run(ctx, "snapshot", "create", source); err != nil {
			b.Fatalf("%s: snapshot: %v\n%s", p.name, err, out)
		}
	}))
	ids, err := c.SnapshotIDs(ctx, source)
	if err != nil || len(ids) != 1 {
		b.Fatalf("%s: snapshots of %s: %v %v, want the one just taken", p.name, source, ids, err)
	}
	id := ids[0]

	target := filepath.Join(b.TempDir(), "restored")
	p.restore = append(p.restore, p.timed(b, "restore", func() {
		if out, err := c.Run(ctx, "snapshot", "restore", id, target); err != nil {
			b.Fatalf("%s: restore: %v\n%s", p.name, err, out)
		}
	}))
	if err := sameFiles(target, sums); err != nil {
		b.Fatalf("%s: restored %s: %v", p.name, id, err)
	}
	if err := os.RemoveAll(target); err != nil {
		b.Fatal(err)
	}
}

// timed runs f, which moves p.bytes, and returns its seconds; it
// records what the server side spent meanwhile under what.
func (p *dataPath) timed(b *testing.B, what string, f func()) float64 {
	b.Helper()
	before := p.serverCPU(b)
	start := time.Now()
	f()
	elapsed := time.Since(start).Seconds()
	gib := float64(p.bytes) / (1 << 30)
	var spent time.Duration
	for name, after := range p.serverCPU(b) {
		spent += after - before[name]
		if len(p.server) > 1 {
			p.cpuPerGiB[what+"/"+name] = append(p.cpuPerGiB[what+"/"+name], (after-before[name]).Seconds()/gib)
		}
	}
	if len(p.server) > 0 {
		p.cpuPerGiB[what] = append(p.cpuPerGiB[what], spent.Seconds()/gib)
	}
	return elapsed
}

// measureParallel snapshots parallelUploads fresh trees at once, one per
// client.
func (p *dataPath) measureParallel(ctx context.Context, b *testing.B) {
	b.Helper()
	sources := make([]string, len(p.clients))
	for i := range sources {
		sources[i], _ = randomTree(b, p.bytes/int64(len(p.clients)), 2)
	}
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for i, c := range p.clients {
		g.Go(func() error {
			if out, err := c.Run(gctx, "snapshot", "create", sources[i]); err != nil {
				return fmt.Errorf("%s: snapshot %d of %d at once: %w\n%s", p.name, i+1, len(p.clients), err, out)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start).Seconds()
	p.parallel = append(p.parallel, float64(p.bytes>>20)/elapsed)
	for _, s := range sources {
		if err := os.RemoveAll(s); err != nil {
			b.Fatal(err)
		}
	}
}

// directPath is kopia writing a repository of its own on the storage,
// with the repository password.
func directPath(ctx context.Context, b *testing.B, minio *testbed.MinIO) *dataPath {
	b.Helper()
	password := testbed.RandomPassword()
	var storage []string
	var env []string
	if minio != nil {
		if err := minio.CreateBucket("direct"); err != nil {
			b.Fatal(err)
		}
		storage = []string{"s3", "--bucket=direct", "--endpoint=" + minio.Endpoint, "--region=" + testbed.MinIORegion, "--disable-tls"}
		env = []string{"AWS_ACCESS_KEY_ID=" + minio.AccessKeyID, "AWS_SECRET_ACCESS_KEY=" + minio.SecretAccessKey}
	} else {
		storage = []string{"filesystem", "--path=" + filepath.Join(b.TempDir(), "repository")}
	}
	p := &dataPath{name: "direct", cpuPerGiB: map[string][]float64{}}
	for i := range parallelUploads {
		c := testbed.NewKopiaClient(b)
		verb := "connect"
		if i == 0 {
			verb = "create"
		}
		if out, err := c.RunWithEnv(ctx, append(env, "KOPIA_PASSWORD="+password), append([]string{"repository", verb}, storage...)...); err != nil {
			b.Fatalf("direct: repository %s: %v\n%s", verb, err, out)
		}
		p.clients = append(p.clients, c)
	}
	return p
}

// plainServerPath is kopia through `kopia server start` on loopback, with
// TLS, as one repository user.
func plainServerPath(ctx context.Context, b *testing.B, minio *testbed.MinIO) *dataPath {
	b.Helper()
	var opts testbed.KopiaServerOptions
	if minio != nil {
		if err := minio.CreateBucket("server"); err != nil {
			b.Fatal(err)
		}
		opts.S3 = &testbed.KopiaS3{MinIO: minio, Bucket: "server"}
	}
	server := testbed.StartKopiaServer(b, opts)
	const user = "guest@bench"
	password := testbed.RandomPassword()
	server.AddUser(b, user, password)
	p := &dataPath{name: "server", server: map[string]*testbed.Process{"kopia": server.Process}, cpuPerGiB: map[string][]float64{}}
	for range parallelUploads {
		c := testbed.NewKopiaClient(b)
		if out, err := c.Connect(ctx, server.URL, server.CA.CertPEM(), user, password); err != nil {
			b.Fatalf("server: connect: %v\n%s", err, out)
		}
		p.clients = append(p.clients, c)
	}
	return p
}

// productPath is kopia through a BSLS's server pod, as a VM's guest, with
// the credentials the webhook issued the VM.
func productPath(ctx context.Context, b *testing.B, minio *testbed.MinIO) *dataPath {
	b.Helper()
	const ns, vm = "bench", "web"
	// The managers log through controller-runtime's global logger.
	ctrllog.SetLogger(logr.Discard())
	platform := local.Start(b, local.Options{})
	c := platform.API.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	port, err := testbed.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: ns},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{ClientURL: "https://127.0.0.1:" + strconv.Itoa(port)},
	}
	if minio != nil {
		if err := minio.CreateBucket("product"); err != nil {
			b.Fatal(err)
		}
		creds := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s3-credentials", Namespace: ns},
			Data: map[string][]byte{
				storagecreds.AccessKeyID:     []byte(minio.AccessKeyID),
				storagecreds.SecretAccessKey: []byte(minio.SecretAccessKey),
			},
		}
		if err := c.Create(ctx, creds); err != nil {
			b.Fatal(err)
		}
		bsls.Spec.Storage.S3 = &v1alpha1.S3Storage{
			Bucket: "product", Endpoint: minio.Endpoint, Region: testbed.MinIORegion, DisableTLS: true,
			CredentialsSecret: corev1.LocalObjectReference{Name: creds.Name},
		}
	} else {
		bsls.Spec.Storage.Filesystem = &v1alpha1.FilesystemStorage{}
	}
	if err := c.Create(ctx, bsls); err != nil {
		b.Fatal(err)
	}
	pod, err := platform.ServeBSLS(ctx, b, bsls, port)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Create(ctx, testbed.SmallVM(ns, vm, map[string]string{v1alpha1.AnnotationServer: ns + "/" + bsls.Name})); err != nil {
		b.Fatal(err)
	}
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.CredentialSecretName(vm)}
	if err := c.Get(ctx, key, secret); err != nil {
		b.Fatalf("the VM's credential Secret: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls); err != nil {
		b.Fatal(err)
	}
	// The session gate runs in container user-sync, Kopia's server in
	// container kopia.
	p := &dataPath{name: "product", server: pod.Containers, cpuPerGiB: map[string][]float64{}}
	user, password := string(secret.Data[v1alpha1.SecretKeyUsername]), string(secret.Data[v1alpha1.SecretKeyPassword])
	first := testbed.NewKopiaClient(b)
	// The server pod provisions the VM's user shortly after the webhook
	// issued it.
	err = testbed.WaitFor(time.Minute, time.Second, func() (bool, error) {
		_, err := first.Connect(ctx, bsls.Spec.ClientURL, []byte(bsls.Status.TLSCA), user, password)
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("product: the VM's guest never connected: %v", err)
	}
	p.clients = append(p.clients, first)
	for range parallelUploads - 1 {
		c := testbed.NewKopiaClient(b)
		if out, err := c.Connect(ctx, bsls.Spec.ClientURL, []byte(bsls.Status.TLSCA), user, password); err != nil {
			b.Fatalf("product: connect: %v\n%s", err, out)
		}
		p.clients = append(p.clients, c)
	}
	return p
}

// randomTree writes files random files making size bytes into a new
// folder, and returns it with each file's SHA-256.
func randomTree(b *testing.B, size int64, files int) (string, map[string][32]byte) {
	b.Helper()
	dir, err := os.MkdirTemp(b.TempDir(), "source")
	if err != nil {
		b.Fatal(err)
	}
	sums := map[string][32]byte{}
	// ChaCha8 with a fresh seed: nothing repeats across trees, at the
	// speed of memory rather than of the kernel's generator.
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	random := rand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for i := range files {
		name := "file" + strconv.Itoa(i)
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		for range size / int64(files) / int64(len(buf)) {
			_, _ = random.Read(buf)
			h.Write(buf)
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		sums[name] = [32]byte(h.Sum(nil))
	}
	return dir, sums
}

// sameFiles checks that dir holds exactly the files of sums, byte for
// byte.
func sameFiles(dir string, sums map[string][32]byte) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) != len(sums) {
		return fmt.Errorf("%d files, want %d", len(entries), len(sums))
	}
	for name, want := range sums {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		if !bytes.Equal(h.Sum(nil), want[:]) {
			return fmt.Errorf("%s differs from what was snapshotted", name)
		}
	}
	return nil
}

// median is the middle of xs (the mean of the two middle ones for an even
// count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// logDataPath prints the run's medians as a table, with the load average
// the figures were taken at.
func logDataPath(b *testing.B, paths []*dataPath, scale dataPathScale) {
	b.Helper()
	load, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d MiB per snapshot, medians of %d rounds, load average %s", scale.bytes>>20, scale.rounds, strings.Join(strings.Fields(string(load))[:3], " "))
	b.Logf("  %-8s %9s %9s %18s %18s %14s", "path", "snapshot", "restore", "CPU-s/GiB snapshot", "CPU-s/GiB restore", fmt.Sprintf("%d at once MiB/s", parallelUploads))
	for _, p := range paths {
		line := fmt.Sprintf("  %-8s %8.2fs %8.2fs", p.name, median(p.snapshot), median(p.restore))
		if len(p.server) > 0 {
			line += fmt.Sprintf(" %18.2f %18.2f", median(p.cpuPerGiB["snapshot"]), median(p.cpuPerGiB["restore"]))
		} else {
			line += fmt.Sprintf(" %18s %18s", "-", "-")
		}
		line += fmt.Sprintf(" %14.1f", median(p.parallel))
		if _, ok := p.cpuPerGiB["snapshot/user-sync"]; ok {
			// go test prints 10 lines of a benchmark that passes: the
			// split goes on the product's own.
			line += fmt.Sprintf("   snapshot CPU: gate (user-sync) %.2f + Kopia's server %.2f",
				median(p.cpuPerGiB["snapshot/user-sync"]), median(p.cpuPerGiB["snapshot/kopia"]))
		}
		b.Log(line)
	}
}

// dataPathGoals fails the run for each product ÷ plain server ratio that
// misses its goal by more than the run's noise. The noise of a figure is
// the spread of the plain server's own rounds, (max − min) ÷ median: the
// plain server is what the product is measured against, and its rounds
// differ only by what else the machine ran meanwhile. A ratio above
// goal × (1 + noise), or for the parallel throughput below
// goal × (1 − noise), fails. One round measures no noise and checks
// nothing.
func dataPathGoals(b *testing.B, server, product *dataPath, rounds int) {
	b.Helper()
	if rounds < 2 {
		b.Log("goals not checked: one round measures no noise")
		return
	}
	for _, g := range []struct {
		name            string
		server, product []float64
		goal            float64
		atLeast         bool
	}{
		{"snapshot time", server.snapshot, product.snapshot, goalSnapshotRatio, false},
		{"restore time", server.restore, product.restore, goalRestoreRatio, false},
		{"server CPU per GiB snapshotted", server.cpuPerGiB["snapshot"], product.cpuPerGiB["snapshot"], goalCPURatio, false},
		{fmt.Sprintf("%d snapshots at once, MiB/s", parallelUploads), server.parallel, product.parallel, goalParallelRatio, true},
	} {
		ratio := median(g.product) / median(g.server)
		noise := (slices.Max(g.server) - slices.Min(g.server)) / median(g.server)
		bound, missed := "≤", ratio > g.goal*(1+noise)
		if g.atLeast {
			bound, missed = "≥", ratio < g.goal*(1-noise)
		}
		b.Logf("  product ÷ server, %s: %.2f (goal %s %.2f, noise ±%.0f%%)", g.name, ratio, bound, g.goal, 100*noise)
		if missed {
			b.Errorf("product ÷ server, %s: %.2f misses its goal (%s %.2f) by more than the run's noise (±%.0f%%)", g.name, ratio, bound, g.goal, 100*noise)
		}
	}
}
