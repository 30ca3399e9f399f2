package testbed

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestStorageEmulators starts fake-gcs-server and Azurite, creates a
// bucket and a container, checks that they listen on loopback only, that
// Azurite's account key is neither in its arguments nor in its log, and
// that their cleanup leaves nothing running.
func TestStorageEmulators(t *testing.T) {
	RequireTestBed(t)
	var gcs *FakeGCS
	var azurite *Azurite
	t.Run("fake-gcs-server", func(t *testing.T) {
		gcs = StartFakeGCS(t)
		if err := gcs.CreateBucket("bucket"); err != nil {
			t.Fatal(err)
		}
		if names, err := gcs.Objects("bucket", ""); err != nil || len(names) != 0 {
			t.Fatalf("new bucket lists %v, %v; want nothing", names, err)
		}
		if _, err := gcs.Objects("absent", ""); err == nil {
			t.Fatal("listing a bucket that does not exist succeeded")
		}
		notElsewhere(t, gcs.Host)
	})
	t.Run("azurite", func(t *testing.T) {
		azurite = StartAzurite(t)
		if err := azurite.CreateContainer("container"); err != nil {
			t.Fatal(err)
		}
		if names, err := azurite.Blobs("container", ""); err != nil || len(names) != 0 {
			t.Fatalf("new container lists %v, %v; want nothing", names, err)
		}
		if _, err := azurite.Blobs("absent", ""); err == nil {
			t.Fatal("listing a container that does not exist succeeded")
		}
		if strings.Contains(strings.Join(azurite.Process.Spec.Args, " "), azurite.Key) || strings.Contains(azurite.Process.Log(), azurite.Key) {
			t.Error("the account key is in Azurite's arguments or log")
		}
		notElsewhere(t, strings.TrimPrefix(azurite.ProxyURL, "http://"))
	})
	for name, p := range map[string]*Process{"fake-gcs-server": gcs.Process, "azurite": azurite.Process} {
		if exited, _ := p.Exited(); !exited {
			t.Errorf("%s still runs after its test's cleanup", name)
		}
	}
}

// notElsewhere checks that the server at loopback address addr cannot be
// reached at this host's other addresses.
func notElsewhere(t *testing.T, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, ok := a.(*net.IPNet)
		if !ok || ip.IP.IsLoopback() || ip.IP.To4() == nil {
			continue
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip.IP.String(), port), 5*time.Second); err == nil {
			c.Close()
			t.Errorf("%s answers on %s too: it must listen on loopback only", addr, ip.IP)
		}
	}
}
