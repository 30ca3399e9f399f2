package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// runMainEnv makes this test binary run the demo's main instead of its
// tests (TestMain), so a test can run the demo as `make demo` does.
const runMainEnv = "GUESTBACKUP_DEMO_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"demo"}, strings.Fields(os.Getenv(runMainEnv+"_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemoTakesItsFlags runs the demo's main with -h and every flag the
// README names: it prints its usage and exits 0. A flag that another
// linked package defined on the global set first (KubeVirt's client
// library defines -v) would panic here.
func TestDemoTakesItsFlags(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS=-v -guest=false -image=stock -node=false -cluster=false -h")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo -h: %v\n%s", err, out)
	}
	for _, flag := range []string{"-v", "-guest", "-image", "-node", "-cluster"} {
		if !regexp.MustCompile(`(?m)^\s+` + flag + `\b`).Match(out) {
			t.Errorf("the usage does not name %s:\n%s", flag, out)
		}
	}
}

func TestCheckFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     []string
		image   string
		onNode  bool
		wantErr string
	}{
		{"the local demo with the stock guest", nil, imageStock, false, ""},
		{"the local demo with the test image", []string{"image"}, imageKopia, false, ""},
		{"the local demo without its guest", []string{"guest"}, imageStock, false, ""},
		{"an unknown image", []string{"image"}, "ubuntu", false, "-image=ubuntu: want stock or kopia"},
		{"the node demo", []string{"node"}, imageStock, true, ""},
		{"the node demo with an image", []string{"node", "image"}, imageKopia, true, "-image applies to the local demo only"},
		{"the cluster demo without its guest", []string{"cluster", "guest"}, imageStock, true, "-guest applies to the local demo only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]bool{}
			for _, name := range tc.set {
				set[name] = true
			}
			err := checkFlags(set, tc.image, tc.onNode)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("checkFlags = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestDemoNarratesUpToAReadyServer runs the demo without its guest (the
// end-to-end suite boots one on the same path, internal/local): every step
// up to a Ready server is narrated, and everything it started is stopped.
func TestDemoNarratesUpToAReadyServer(t *testing.T) {
	testbed.RequireTestBed(t)
	var out bytes.Buffer
	r := newRun(&out, testing.Verbose())
	err := r.guard(func() error { return demo(context.Background(), r, false, true) })
	if cerr := r.close(); cerr != nil {
		t.Errorf("stopping: %v", cerr)
	}
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"==> 1. Starting a real API server",
		"==> 2. Admin: creating BackupStorageLocationServer backup/main",
		"Ready: endpoint https://10.0.2.2:",
		"the demo stops here, with the server ready",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the narration lacks %q:\n%s", want, out.String())
		}
	}
	if r.Failed() {
		t.Errorf("the run was marked failed:\n%s", out.String())
	}
}

// TestClientStory: what the demo says about the guest's kopia comes from
// the guest's own console lines, checked against what the server
// published, and nothing is claimed that the guest did not report.
func TestClientStory(t *testing.T) {
	const (
		sum   = "5f1d8e4a3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a69"
		other = "0000000000000000000000000000000000000000000000000000000000000000"
		url   = "https://10.0.2.2:40001/kopia/linux-amd64"
	)
	published := &v1alpha1.ClientStatus{Version: "v0.23.1", SHA256: map[string]string{"amd64": sum, "arm64": other}}
	// The lines as the demo's report copies them from the guest's
	// journal (pkg/cloudinit's connect script) to its console.
	fetched := "guestbackup: fetching kopia v0.23.1 for amd64 from " + url
	installed := "guestbackup: installed kopia v0.23.1 (" + sum + ") from " + url + " in /usr/local/lib/guestbackup"
	for _, tt := range []struct {
		name      string
		said      []string
		published *v1alpha1.ClientStatus
		want      []string
		wantErr   string
	}{
		{name: "a stock image fetches and verifies its client",
			said:      []string{"the image's own kopia: none", fetched, installed, "status: 2026-11-25T10:00:00Z connected to https://10.0.2.2:40000 as web@team-a"},
			published: published,
			want: []string{
				"the image has no kopia of its own",
				"the guest downloaded kopia v0.23.1 for amd64 from its server, " + url + ", trusting the BSLS's CA and no other",
				"it verified the SHA-256 its bootstrap carries before running it: " + sum + ", the server's status.client.sha256.amd64; installed in /usr/local/lib/guestbackup",
			}},
		{name: "an image whose kopia is the server's build downloads nothing",
			said:      []string{"the image's own kopia: /usr/local/bin/kopia", "guestbackup: installed kopia v0.23.1 (" + sum + ") from this guest's /usr/local/bin/kopia in /usr/local/lib/guestbackup"},
			published: published,
			want: []string{
				"the image has a kopia of its own, /usr/local/bin/kopia",
				"it verified the SHA-256 its bootstrap carries before running it: " + sum + ", the server's status.client.sha256.amd64; installed in /usr/local/lib/guestbackup",
				"(from this guest's /usr/local/bin/kopia: the same build as the server's, so nothing was downloaded)",
			}},
		{name: "a client the server did not publish is no success",
			said:      []string{fetched, "guestbackup: installed kopia v0.23.1 (" + other + ") from " + url + " in /usr/local/lib/guestbackup"},
			published: published,
			wantErr:   "the server published",
		},
		{name: "a guest that reported no client is no success",
			said:      []string{"the image's own kopia: none", fetched, "status: error: cannot download the kopia client"},
			published: published,
			wantErr:   "reported no kopia client installed",
		},
		{name: "a server that published no client is no success",
			said:    []string{fetched, installed},
			wantErr: "published no kopia client",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := clientStory(tt.said, tt.published)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("clientStory: %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("clientStory:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}
