package testbed

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
)

// AzuriteDomain is the blob endpoint's domain of the test bed's Azurite
// servers, in the reserved .test domain: nothing resolves it.
const AzuriteDomain = "blob.azurite.test"

// Azurite is a running Azurite blob service on loopback, speaking Azure
// Blob Storage over plain HTTP: the container of the Velero azure specs.
//
// Kopia's Azure storage reaches a storage account only at
// <scheme>://<account>.<domain>/ (production-style URLs), and Azurite
// reads the account from such a host name, but no resolver maps
// <account>.blob.azurite.test to loopback (Go resolves no *.localhost
// either). The test bed plays that DNS record with the environment's HTTP
// proxy: a process with Env in its environment sends its plain-HTTP
// requests for http://<account>.<Domain>/ to Azurite itself, which serves
// them by their Host header. Kopia's code is unmodified.
type Azurite struct {
	// Domain is <AzuriteDomain>:<port>, the BSL's storageAccountURI's host
	// after the account; ProxyURL is http://127.0.0.1:<port>.
	Domain, ProxyURL string
	// Account and Key are the one storage account the server has.
	Account, Key string
	// Process is the running server; its log is printed when the test fails.
	Process *Process

	client *azblob.Client
}

// StartAzurite runs Azurite's blob service with node on a free 127.0.0.1
// port, with one storage account of a random key, its data in a temporary
// folder, and returns once it answers. The test's cleanup stops it.
func StartAzurite(tb TB) *Azurite {
	tb.Helper()
	script := optionalTool(tb, "GUESTBACKUP_AZURITE", MustTools(tb).Azurite)
	node, err := exec.LookPath("node")
	if err != nil {
		tb.Fatalf("Azurite needs node on PATH: %v", err)
	}
	port, err := FreePort()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	key := make([]byte, 64)
	if _, err := rand.Read(key); err != nil {
		tb.Fatalf("%v", err)
	}
	dir := tb.TempDir()
	a := &Azurite{
		Domain:   AzuriteDomain + ":" + strconv.Itoa(port),
		ProxyURL: "http://127.0.0.1:" + strconv.Itoa(port),
		Account:  fmt.Sprintf("testbed%x", key[:4]), // lowercase letters and digits, as Azure wants
		Key:      base64.StdEncoding.EncodeToString(key),
	}
	a.Process = StartProcess(tb, ProcessSpec{
		Name: "azurite-" + strconv.Itoa(port),
		Path: node,
		Args: []string{
			script,
			"--blobHost=127.0.0.1", "--blobPort=" + strconv.Itoa(port),
			"--location=" + filepath.Join(dir, "data"),
			"--disableTelemetry",
			// Kopia's SDK may be newer than the emulator's API version.
			"--skipApiVersionCheck", "--loose",
		},
		// Its one account, instead of the well-known devstoreaccount1.
		Env: []string{"AZURITE_ACCOUNTS=" + a.Account + ":" + a.Key},
		Dir: filepath.Join(dir, "home"),
	})
	if a.client, err = a.newClient(); err != nil {
		tb.Fatalf("Azurite client: %v", err)
	}
	err = WaitFor(emulatorStartTimeout, 100*time.Millisecond, func() (bool, error) {
		if exited, err := a.Process.Exited(); exited {
			return false, fmt.Errorf("azurite exited: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), emulatorCallTimeout)
		defer cancel()
		_, err := a.client.ServiceClient().GetProperties(ctx, nil)
		return err == nil, nil
	})
	if err != nil {
		tb.Fatalf("Azurite at %s: %v\n%s", a.ProxyURL, err, tail(a.Process.LogPath, 40))
	}
	return a
}

// URI is the storage account's blob endpoint, as a Velero BSL's
// config.storageAccountURI names it.
func (a *Azurite) URI() string { return "http://" + a.Account + "." + a.Domain }

// Env is what a process needs in its environment to reach URI.
func (a *Azurite) Env() []string { return []string{"HTTP_PROXY=" + a.ProxyURL} }

// newClient is a client of the account that reaches it as Env does.
func (a *Azurite) newClient() (*azblob.Client, error) {
	cred, err := azblob.NewSharedKeyCredential(a.Account, a.Key)
	if err != nil {
		return nil, err
	}
	proxy, err := url.Parse(a.ProxyURL)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	return azblob.NewClientWithSharedKeyCredential(a.URI()+"/", cred, &azblob.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport:                       hc,
		Retry:                           policy.RetryOptions{MaxRetries: -1},
		InsecureAllowCredentialWithHTTP: true,
	}})
}

// CreateContainer creates a container in the account.
func (a *Azurite) CreateContainer(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), emulatorCallTimeout)
	defer cancel()
	if _, err := a.client.CreateContainer(ctx, name, nil); err != nil {
		return fmt.Errorf("create container %s: %w", name, err)
	}
	return nil
}

// Blobs lists the names of the blobs under prefix in container, sorted.
func (a *Azurite) Blobs(container, prefix string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), emulatorCallTimeout)
	defer cancel()
	var names []string
	pager := a.client.NewListBlobsFlatPager(container, &azblob.ListBlobsFlatOptions{Prefix: &prefix})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s/%s: %w", container, prefix, err)
		}
		for _, b := range page.Segment.BlobItems {
			names = append(names, *b.Name)
		}
	}
	sort.Strings(names)
	return names, nil
}
