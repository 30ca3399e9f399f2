package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// emulatorCallTimeout bounds one call of the harness to a storage emulator,
// and emulatorStartTimeout its start.
const (
	emulatorCallTimeout  = 30 * time.Second
	emulatorStartTimeout = 2 * time.Minute
)

// FakeGCS is a running fake-gcs-server on loopback, speaking Google Cloud
// Storage's JSON API over plain HTTP: the bucket of the Velero gcp specs.
// Google's storage client, which Kopia's GCS storage uses unmodified,
// reaches it when STORAGE_EMULATOR_HOST names it (Env), and then sends no
// credentials: the emulator checks none.
type FakeGCS struct {
	// Host is 127.0.0.1:<port>; URL is http://<Host>.
	Host, URL string
	// Process is the running server; its log is printed when the test fails.
	Process *Process
}

// StartFakeGCS runs fake-gcs-server on a free 127.0.0.1 port, keeping its
// buckets in a temporary folder, and returns once it lists buckets. The
// test's cleanup stops it.
func StartFakeGCS(tb TB) *FakeGCS {
	tb.Helper()
	bin := optionalTool(tb, "GUESTBACKUP_FAKE_GCS", MustTools(tb).FakeGCS)
	port, err := FreePort()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	dir := tb.TempDir()
	g := &FakeGCS{Host: "127.0.0.1:" + strconv.Itoa(port)}
	g.URL = "http://" + g.Host
	g.Process = StartProcess(tb, ProcessSpec{
		Name: "fake-gcs-server-" + strconv.Itoa(port),
		Path: bin,
		Args: []string{
			"-scheme=http", "-host=127.0.0.1", "-port=" + strconv.Itoa(port),
			"-backend=filesystem", "-filesystem-root=" + filepath.Join(dir, "data"),
			// Upload sessions point back at it, never at Google.
			"-public-host=" + g.Host, "-external-url=" + g.URL,
			"-log-level=warn",
		},
		Dir: filepath.Join(dir, "home"),
	})
	err = WaitFor(emulatorStartTimeout, 100*time.Millisecond, func() (bool, error) {
		if exited, err := g.Process.Exited(); exited {
			return false, fmt.Errorf("fake-gcs-server exited: %v", err)
		}
		return g.call(http.MethodGet, "/storage/v1/b", nil, nil) == nil, nil
	})
	if err != nil {
		tb.Fatalf("fake-gcs-server at %s: %v\n%s", g.URL, err, tail(g.Process.LogPath, 40))
	}
	return g
}

// Env is what a process needs in its environment to use this server
// through Google's storage client.
func (g *FakeGCS) Env() []string { return []string{"STORAGE_EMULATOR_HOST=" + g.Host} }

// CreateBucket creates a bucket.
func (g *FakeGCS) CreateBucket(name string) error {
	body, err := json.Marshal(map[string]string{"name": name})
	if err != nil {
		return err
	}
	if err := g.call(http.MethodPost, "/storage/v1/b?project=testbed", body, nil); err != nil {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}

// Objects lists the names of the objects under prefix in bucket, sorted.
func (g *FakeGCS) Objects(bucket, prefix string) ([]string, error) {
	var names []string
	token := ""
	for range 1000 { // pages; a spec's bucket holds far fewer
		var page struct {
			Items         []struct{ Name string } `json:"items"`
			NextPageToken string                  `json:"nextPageToken"`
		}
		q := url.Values{"prefix": {prefix}}
		if token != "" {
			q.Set("pageToken", token)
		}
		if err := g.call(http.MethodGet, "/storage/v1/b/"+url.PathEscape(bucket)+"/o?"+q.Encode(), nil, &page); err != nil {
			return nil, fmt.Errorf("list gs://%s/%s: %w", bucket, prefix, err)
		}
		for _, item := range page.Items {
			names = append(names, item.Name)
		}
		if token = page.NextPageToken; token == "" {
			sort.Strings(names)
			return names, nil
		}
	}
	return nil, fmt.Errorf("list gs://%s/%s: too many pages", bucket, prefix)
}

// call sends one JSON API request and decodes the answer into out.
func (g *FakeGCS) call(method, path string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), emulatorCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, g.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// optionalTool fails the test, telling what to run, when a tool that
// LoadTools does not require is not built.
func optionalTool(tb TB, name, path string) string {
	tb.Helper()
	if info, err := os.Stat(path); path == "" || err != nil || info.IsDir() {
		tb.Fatalf("%s: %q is not built: run `make tools`", name, path)
	}
	return path
}
