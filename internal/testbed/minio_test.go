package testbed

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// TestMinIO starts a MinIO server, creates a bucket, checks that the
// credentials are neither in its arguments nor in its log, and that its
// cleanup leaves nothing listening.
func TestMinIO(t *testing.T) {
	RequireTestBed(t)
	var m *MinIO
	t.Run("serve", func(t *testing.T) {
		m = StartMinIO(t)
		if err := m.CreateBucket("bucket"); err != nil {
			t.Fatal(err)
		}
		if err := m.CreateBucket("bucket"); err == nil {
			t.Fatal("creating a bucket twice succeeded")
		}
		keys, err := m.Objects("bucket", "")
		if err != nil || len(keys) != 0 {
			t.Fatalf("new bucket lists %v, %v; want nothing", keys, err)
		}
		if _, err := m.Objects("absent", ""); err == nil {
			t.Fatal("listing a bucket that does not exist succeeded")
		}
		other, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKeyID, m.SecretAccessKey, ""), Region: "eu-west-1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.BucketExists(t.Context(), "bucket"); err == nil || !strings.Contains(err.Error(), "region") {
			t.Fatalf("a request signed for another region than %s: error %v, want one about the region", MinIORegion, err)
		}
		args := strings.Join(m.Process.Spec.Args, " ")
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(m.Process.cmd.Process.Pid) + "/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{m.SecretAccessKey, m.AccessKeyID} {
			if strings.Contains(args, secret) || strings.Contains(string(cmdline), secret) {
				t.Errorf("a credential is in minio's arguments: %s", args)
			}
			if strings.Contains(m.Process.Log(), secret) {
				t.Errorf("a credential is in minio's log:\n%s", m.Process.Log())
			}
		}
	})
	if exited, _ := m.Process.Exited(); !exited {
		t.Fatal("minio still runs after its test's cleanup")
	}
}
