package sessiongate_test

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/object"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// BenchmarkSnapshotWrite is the write guard's cost where it shows most: a
// guest's kopia writing through the gate (TLS, HTTP/2, the Kopia server) 16
// MiB of fresh data in one object and flushing it, with no guard, and with
// one that refuses nobody (each message's prefix followed both ways).
func BenchmarkSnapshotWrite(b *testing.B) {
	testbed.RequireTestBed(b)
	server := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{})
	const size = 16 << 20
	for _, tc := range []struct {
		name  string
		guard sessiongate.WriteGuard
	}{{"no-guard", nil}, {"guard-not-refusing", &writeGuard{}}} {
		b.Run(tc.name, func(b *testing.B) {
			_, url := serveGate(b, server, sessiongate.Options{Writes: tc.guard})
			username := "bench-" + tc.name + "@team-e"
			password := testbed.RandomPassword()
			server.AddUser(b, username, password)
			ctx := context.Background()
			config, err := connectClient(ctx, url, server.CAPin, b.TempDir(), username, password)
			if err != nil {
				b.Fatal(err)
			}
			r, err := repo.Open(ctx, config, password, &repo.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close(ctx)
			data := make([]byte, size)
			b.SetBytes(size)
			for b.Loop() {
				b.StopTimer()
				_, _ = rand.Read(data)
				b.StartTimer()
				err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "bench"}, func(ctx context.Context, w repo.RepositoryWriter) error {
					ow := w.NewObjectWriter(ctx, object.WriterOptions{})
					defer ow.Close()
					if _, err := ow.Write(data); err != nil {
						return err
					}
					_, err := ow.Result()
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
