package cloudinit

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
)

// TestGolden compares every rendering a guest gets with its golden file in
// testdata/golden: the cloud-config alone and with paths, merged with a
// VM's own cloud-config, and the secret disk's install script. A stale,
// missing or orphaned golden fails; go test ./pkg/cloudinit -run TestGolden
// -update rewrites them.
func TestGolden(t *testing.T) {
	withPaths := testBootstrap(t)
	withPaths.Paths = []string{"/etc", "/home/alice/my notes"}
	withPaths.Schedule = "*-*-* 02:30:00"
	withClient := testBootstrap(t)
	withClient.Client = testClient()
	withRequests := withClient
	withRequests.Paths = []string{"/srv"}
	withRequests.RequestPoll = 30 * time.Second
	got := map[string][]byte{}
	for name, b := range map[string]Bootstrap{"connect-only": testBootstrap(t), "with-paths": withPaths, "with-client": withClient, "with-requests": withRequests} {
		rendered, err := CloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		got[name+".cloud-config"] = rendered
	}
	got["merged.multipart"] = mustMerge(t, []byte(userCloudConfig), got["connect-only.cloud-config"])
	disk := testBootstrap(t)
	disk.Paths = []string{"/srv/data"}
	files, err := DiskFiles(disk)
	if err != nil {
		t.Fatal(err)
	}
	got["disk-install.sh"] = files["install.sh"]
	golden.Check(t, filepath.Join("testdata", "golden"), got)
}

// testClient is a server's published client, with made-up sums.
func testClient() *v1alpha1.ClientStatus {
	return &v1alpha1.ClientStatus{
		URL: "https://main.backup.svc:51516", Version: "v0.23.1",
		SHA256: map[string]string{"amd64": strings.Repeat("a1", 32), "arm64": strings.Repeat("b2", 32)},
	}
}

// A password that is obviously not a real one.
const testPassword = "not-a-real-password-0123456789"

// testCA is a fixed CA certificate (testdata/ca.crt), so goldens are stable.
func testCA(t testing.TB) []byte {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join("testdata", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func testBootstrap(t testing.TB) Bootstrap {
	return Bootstrap{ServerURL: "https://main.backup.svc:51515", CA: testCA(t), Username: "web@team-a", Password: testPassword, Generation: 1}
}

// TestCloudConfigIsStable: rendering a Bootstrap twice gives one payload
// (TestGolden says which).
func TestCloudConfigIsStable(t *testing.T) {
	withPaths := testBootstrap(t)
	withPaths.Paths = []string{"/etc", "/home/alice/my notes"}
	withPaths.Schedule = "*-*-* 02:30:00"
	for name, b := range map[string]Bootstrap{"connect-only": testBootstrap(t), "with-paths": withPaths} {
		t.Run(name, func(t *testing.T) {
			got, err := CloudConfig(b)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := CloudConfig(b)
			if !bytes.Equal(got, again) {
				t.Error("rendering twice gives two payloads")
			}
		})
	}
}

func TestMergeKeepsTheUserPartByteForByte(t *testing.T) {
	ours, err := CloudConfig(testBootstrap(t))
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]string{
		"cloud-config":      userCloudConfig,
		"crlf and unicode":  "#cloud-config\r\nwrite_files:\r\n  - path: /etc/motd\r\n    content: \"Grüße — ünïcödé\"\r\n",
		"no final newline":  "#cloud-config\nhostname: web",
		"script":            "#!/bin/bash\necho 'user script' > /var/tmp/user-script\n",
		"boothook":          "#cloud-boothook\n#!/bin/sh\necho early\n",
		"include":           "#include\nhttps://config.example.invalid/base.cfg\n",
		"trailing spaces  ": "#cloud-config\nbootcmd:\n  - echo hi   \n\n\n",
	}
	for name, user := range users {
		t.Run(name, func(t *testing.T) {
			merged, err := Merge([]byte(user), ours)
			if err != nil {
				t.Fatal(err)
			}
			if DetectFormat(merged) != FormatMultipart {
				t.Fatalf("merged payload is detected as %s", DetectFormat(merged))
			}
			back, err := UserPart(merged)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, []byte(user)) {
				t.Errorf("the user's part changed:\n%q\nwant\n%q", back, user)
			}
			parts, err := Parts(merged)
			if err != nil || len(parts) != 2 || !bytes.Equal(parts[1].Data, ours) {
				t.Fatalf("want the user's part then ours, got %d parts, %v", len(parts), err)
			}
		})
	}
}

// TestPartsReadsBase64BrokenByAnyWhiteSpace: MIME asks decoders to skip
// what is not base64; a payload someone else wrapped (spaces, tabs, bare
// LF) still gives the VM's part back.
func TestPartsReadsBase64BrokenByAnyWhiteSpace(t *testing.T) {
	user := []byte(userCloudConfig)
	encoded := base64.StdEncoding.EncodeToString(user)
	wrapped := encoded[:10] + " \t" + encoded[10:40] + "\n " + encoded[40:]
	merged := "Content-Type: multipart/mixed; boundary=\"b\"\nMIME-Version: 1.0\n\n--b\r\nContent-Type: text/cloud-config\r\nContent-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"user-data\"\r\n\r\n" + wrapped + "\r\n--b--\r\n"
	back, err := UserPart([]byte(merged))
	if err != nil || !bytes.Equal(back, user) {
		t.Errorf("the user's part: %q, %v; want %q", back, err, user)
	}
}

// userCloudConfig is a VM's own cloud-config, which ours is merged with.
const userCloudConfig = "#cloud-config\npackages: [htop]\nruncmd:\n  - [touch, /var/tmp/user-marker]\n"

func mustMerge(t *testing.T, user, ours []byte) []byte {
	t.Helper()
	m, err := Merge(user, ours)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMergeRefusesWhatCannotCarryASecondPart(t *testing.T) {
	for _, user := range []string{
		"Content-Type: multipart/mixed; boundary=XX\nMIME-Version: 1.0\n\n--XX--\n",
		"#cloud-config-archive\n- type: text/cloud-config\n",
		"#part-handler\ndef list_types(): pass\n",
		"## template: jinja\n#cloud-config\n",
		gzipped("#cloud-config\n"),
		"hostname: web\n",
	} {
		if CanMerge([]byte(user)) {
			t.Errorf("CanMerge(%q) = true", user)
		}
		if _, err := Merge([]byte(user), []byte("#cloud-config\n")); err == nil || !strings.Contains(err.Error(), "disk mode") {
			t.Errorf("Merge(%q): error = %v, want one that points at disk mode", user, err)
		}
	}
}

func TestBootstrapRefusesWhatWouldBreakTheGuestFiles(t *testing.T) {
	for name, mutate := range map[string]func(*Bootstrap){
		"http URL":            func(b *Bootstrap) { b.ServerURL = "http://main.backup.svc:51515" },
		"quote in URL":        func(b *Bootstrap) { b.ServerURL = "https://a'b:1" },
		"no CA":               func(b *Bootstrap) { b.CA = nil },
		"CA not PEM":          func(b *Bootstrap) { b.CA = []byte("0123456789abcdef") },
		"private key for CA":  func(b *Bootstrap) { b.CA = []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n") },
		"invalid identity":    func(b *Bootstrap) { b.Username = "Web@team-a" },
		"short password":      func(b *Bootstrap) { b.Password = "short" },
		"relative path":       func(b *Bootstrap) { b.Paths = []string{"etc"} },
		"newline in path":     func(b *Bootstrap) { b.Paths = []string{"/etc\n[Service]"} },
		"schedule with quote": func(b *Bootstrap) { b.Schedule = "daily\nExecStart=/bin/sh" },
		"client without sums": func(b *Bootstrap) { b.Client = testClient(); b.Client.SHA256 = nil },
		"client sum not hex":  func(b *Bootstrap) { b.Client = testClient(); b.Client.SHA256["amd64"] = "'; reboot; '" },
		"client odd arch":     func(b *Bootstrap) { b.Client = testClient(); b.Client.SHA256["mips"] = strings.Repeat("c3", 32) },
		"client URL quote":    func(b *Bootstrap) { b.Client = testClient(); b.Client.URL = "https://a'b:1" },
		"client URL path":     func(b *Bootstrap) { b.Client = testClient(); b.Client.URL = "https://a:1/x?y" },
	} {
		b := testBootstrap(t)
		mutate(&b)
		if _, err := CloudConfig(b); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
}

func TestDiskFiles(t *testing.T) {
	b := testBootstrap(t)
	b.Paths = []string{"/srv/data"}
	files, err := DiskFiles(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(files["password"]) != testPassword {
		t.Errorf("the disk's password file %q is not the Secret's password key", files["password"])
	}
	fs, _ := b.Files()
	if len(files) != len(fs)+1 {
		t.Errorf("%d disk files for %d bootstrap files and install.sh", len(files), len(fs))
	}
}

func TestParsePaths(t *testing.T) {
	got, err := ParsePaths(" /etc, /home/alice/\n/srv//data ,")
	if err != nil || strings.Join(got, "|") != "/etc|/home/alice|/srv/data" {
		t.Errorf("ParsePaths = %q, %v", got, err)
	}
	if _, err := ParsePaths("/etc,relative"); err == nil {
		t.Error("a relative path was accepted")
	}
}

// The BSLS's spec.guestSpread bounds both the boot connection's random
// delay and the timer's; unset is DefaultSpread for the timer and none for
// the connection, 0s none, and no value goes past MaxSpread.
func TestSpread(t *testing.T) {
	for name, tc := range map[string]struct {
		spec    *metav1.Duration
		want    string
		connect string
	}{
		"unset":     {nil, "900", "0"},
		"none":      {&metav1.Duration{}, "0", "0"},
		"5 minutes": {&metav1.Duration{Duration: 5 * time.Minute}, "300", "300"},
		"too long":  {&metav1.Duration{Duration: 48 * time.Hour}, "86400", "86400"},
	} {
		t.Run(name, func(t *testing.T) {
			b := testBootstrap(t)
			b.Paths = []string{"/etc"}
			b.Spread = SpreadOf(tc.spec)
			files, err := b.Files()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				var want string
				switch f.Path {
				case UnitDir + "/" + ConnectUnit:
					want = "\nEnvironment=GUESTBACKUP_SPREAD=" + tc.connect + "\n"
				case UnitDir + "/" + SnapshotTimer:
					want = "\nRandomizedDelaySec=" + tc.want + "\n"
				default:
					continue
				}
				if !strings.Contains(string(f.Content), want) {
					t.Errorf("%s lacks %q:\n%s", f.Path, want, f.Content)
				}
			}
		})
	}
}
