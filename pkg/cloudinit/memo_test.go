package cloudinit

import (
	"bytes"
	"reflect"
	"strconv"
	"testing"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TestBootstrapKeyCoversEveryField changes each field of a Bootstrap in turn
// and expects a new key: a field added to Bootstrap but not to key() would
// let CloudConfig return another Bootstrap's rendering.
func TestBootstrapKeyCoversEveryField(t *testing.T) {
	base := testBootstrap(t)
	base.Paths = []string{"/etc"}
	base.Schedule = "daily"
	base.Client = &v1alpha1.ClientStatus{Version: "v0.23.1", URL: "https://10.0.2.2:51516", SHA256: map[string]string{"amd64": "aa", "arm64": "bb"}}
	typ := reflect.TypeFor[Bootstrap]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			changed.Paths = append([]string(nil), base.Paths...)
			v := reflect.ValueOf(&changed).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "x")
			case reflect.Int64:
				v.SetInt(v.Int() + 1)
			case reflect.Slice:
				if v.Type().Elem().Kind() == reflect.Uint8 {
					v.SetBytes(append(bytes.Clone(v.Bytes()), 'x'))
				} else {
					v.Set(reflect.Append(v, reflect.ValueOf("/home")))
				}
			case reflect.Pointer:
				// The only pointer is Client: its parts are checked below.
				c := *base.Client
				c.Version += "x"
				v.Set(reflect.ValueOf(&c))
			default:
				t.Fatalf("field %s has kind %s, which this test does not know how to change: teach it, and key()", f.Name, v.Kind())
			}
			if changed.key() == base.key() {
				t.Errorf("changing %s leaves the key unchanged: add it to Bootstrap.key", f.Name)
			}
		})
	}
	// Every part of the client: a guest must never get another server's
	// URL or SHA-256 from the memo.
	for name, change := range map[string]func(*v1alpha1.ClientStatus){
		"no client": nil,
		"URL":       func(c *v1alpha1.ClientStatus) { c.URL += "x" },
		"a SHA-256": func(c *v1alpha1.ClientStatus) { c.SHA256 = map[string]string{"amd64": "ab", "arm64": "bb"} },
		"another arch": func(c *v1alpha1.ClientStatus) {
			c.SHA256 = map[string]string{"amd64": "aa", "arm64": "bb", "riscv64": "cc"}
		},
	} {
		changed := base
		if change == nil {
			changed.Client = nil
		} else {
			c := *base.Client
			change(&c)
			changed.Client = &c
		}
		if changed.key() == base.key() {
			t.Errorf("changing the client's %s leaves the key unchanged: add it to Bootstrap.key", name)
		}
	}
	// Length prefixes: moving bytes between neighbouring fields changes
	// the key too.
	a, b := base, base
	a.Username, a.Password = "ab", "c"
	b.Username, b.Password = "a", "bc"
	if a.key() == b.key() {
		t.Error("fields are not delimited in the key")
	}
}

// TestCloudConfigRemembersExactlyWhatItRenders: a remembered rendering is
// byte for byte a fresh one, and a caller changing what it got does not
// change the next caller's.
func TestCloudConfigRemembersExactlyWhatItRenders(t *testing.T) {
	b := testBootstrap(t)
	b.Paths = []string{"/srv/memo-test"}
	fresh, err := renderCloudConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	first, err := CloudConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		first[i] = 'x'
	}
	second, err := CloudConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(second, fresh) {
		t.Errorf("remembered rendering differs from a fresh one:\n%s\nwant:\n%s", second, fresh)
	}
}

// TestRenderingsStayBounded fills the memo past its size: it keeps memoSize
// renderings, the most recently used among them.
func TestRenderingsStayBounded(t *testing.T) {
	t.Cleanup(renderings.Clear)
	remember("first", []byte("v"))
	for i := range memoSize + 100 {
		remember(strconv.Itoa(i), []byte("v"))
		if i%1000 == 0 {
			remembered("first") // recently used: kept
		}
	}
	if n := renderings.Len(); n != memoSize {
		t.Errorf("memo holds %d renderings, want %d", n, memoSize)
	}
	if _, ok := remembered("first"); !ok {
		t.Error("a recently used rendering was dropped")
	}
	if _, ok := remembered("0"); ok {
		t.Error("the least recently used rendering is still held")
	}
	remember("last", []byte("kept"))
	if got, ok := remembered("last"); !ok || string(got) != "kept" {
		t.Errorf("the newest rendering: got %q, %v", got, ok)
	}
}
