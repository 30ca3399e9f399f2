package cloudinit

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/password"
)

// credentialFields are the fields of a Bootstrap a template's holes take.
var credentialFields = map[string]bool{"Username": true, "Password": true, "Generation": true}

// TestShapeKeyCoversEveryFieldButTheCredentials changes each field of a
// Bootstrap in turn: every field but the credentials changes its shape's
// key, so that a field added to Bootstrap but not to shapeKey() cannot
// have CloudConfig fill another shape's template; the credentials change
// nothing, so that every VM of a shape shares one.
func TestShapeKeyCoversEveryFieldButTheCredentials(t *testing.T) {
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
				t.Fatalf("field %s has kind %s, which this test does not know how to change: teach it, and shapeKey()", f.Name, v.Kind())
			}
			switch same := changed.shapeKey() == base.shapeKey(); {
			case credentialFields[f.Name] && !same:
				t.Errorf("changing credential %s changes the shape's key: every VM would have a template of its own", f.Name)
			case !credentialFields[f.Name] && same:
				t.Errorf("changing %s leaves the shape's key unchanged: add it to Bootstrap.shapeKey", f.Name)
			}
		})
	}
	// Every part of the client: a guest must never get another server's
	// URL or SHA-256 from a template.
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
		if changed.shapeKey() == base.shapeKey() {
			t.Errorf("changing the client's %s leaves the shape's key unchanged: add it to Bootstrap.shapeKey", name)
		}
	}
	// Length prefixes: moving bytes between neighbouring fields changes
	// the key too.
	a, b := base, base
	a.ServerURL, a.CA = base.ServerURL+"-", base.CA[1:]
	b.CA = append([]byte("-"), base.CA[1:]...)
	if a.shapeKey() == b.shapeKey() {
		t.Error("fields are not delimited in the shape's key")
	}
}

// TestTemplatesRenderExactlyWhatRenderingDoes fills the templates of
// several shapes with many random credentials, of every length and
// character a filled template takes, and compares each with the shape
// rendered whole with them.
func TestTemplatesRenderExactlyWhatRenderingDoes(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 20))
	name := func(alphabet string, n int) string {
		var s strings.Builder
		for range n {
			s.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return s.String()
	}
	const lower, fillableChars = "abcdefghijklmnopqrstuvwxyz0123456789-_.", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
	withPaths := testBootstrap(t)
	withPaths.Paths = []string{"/etc", "/home/alice/my notes"}
	withPaths.Schedule = "*-*-* 02:30:00"
	withPaths.Spread = 7 * time.Minute
	withClient := testBootstrap(t)
	withClient.Client = &v1alpha1.ClientStatus{Version: "v0.23.1", URL: "https://10.0.2.2:51516", SHA256: map[string]string{"amd64": strings.Repeat("a", 64), "arm64": strings.Repeat("b", 64)}}
	modes := map[string]struct {
		payload, whole func(Bootstrap) (map[string][]byte, error)
	}{
		v1alpha1.ModeCloudInit: {
			payload: func(b Bootstrap) (map[string][]byte, error) {
				return Payload(b, Placement{Mode: v1alpha1.ModeCloudInit})
			},
			whole: func(b Bootstrap) (map[string][]byte, error) {
				doc, err := renderCloudConfig(b)
				return map[string][]byte{v1alpha1.SecretKeyUserData: doc}, err
			},
		},
		v1alpha1.ModeDisk: {payload: DiskFiles, whole: renderDiskFiles},
	}
	for shape, base := range map[string]Bootstrap{"connect-only": testBootstrap(t), "paths and schedule": withPaths, "with a client": withClient} {
		for mode, render := range modes {
			t.Run(shape+"/"+mode, func(t *testing.T) {
				if _, err := render.payload(base); err != nil {
					t.Fatal(err)
				}
				if tpl, ok := templates.Get(templateKey(mode, base)); !ok || tpl.(payloadTemplate) == nil {
					t.Fatal("the shape has no template: nothing here would be filled")
				}
				for i := range 200 {
					b := base
					b.Username = name(lower, 1+rng.IntN(62)) + "@" + name(lower, 1+rng.IntN(62))
					b.Password = password.New()
					if i%2 == 1 {
						b.Password = name(fillableChars, 16+rng.IntN(200))
					}
					b.Generation = 1 + rng.Int64N(1<<62)
					if !b.canFill() {
						t.Fatalf("credentials %q %q cannot fill a template", b.Username, b.Password)
					}
					filled, err := render.payload(b)
					if err != nil {
						t.Fatal(err)
					}
					whole, err := render.whole(b)
					if err != nil {
						t.Fatal(err)
					}
					if !maps.EqualFunc(filled, whole, bytes.Equal) {
						t.Fatalf("user %s, password %s, generation %d: the filled template differs from the rendering:\n%q\nwant:\n%q", b.Username, b.Password, b.Generation, filled, whole)
					}
				}
			})
		}
	}
}

// TestCredentialsATemplateCannotTakeAreRenderedWhole: a password of other
// characters than the stand-ins' is rendered whole, and what a caller
// does to what it got changes no other rendering.
func TestCredentialsATemplateCannotTakeAreRenderedWhole(t *testing.T) {
	for _, pw := range []string{"a password with spaces", `quote'"and\backslash!`, "ünïcödé-password-long-enough"} {
		b := testBootstrap(t)
		b.Password = pw
		if b.canFill() {
			t.Errorf("password %q fills a template", pw)
		}
		got, err := CloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		whole, err := renderCloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, whole) {
			t.Errorf("password %q: CloudConfig differs from the rendering", pw)
		}
	}
	b := testBootstrap(t)
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
	if whole, _ := renderCloudConfig(b); !bytes.Equal(second, whole) {
		t.Error("changing a rendering changed the template")
	}
}

// TestTemplatesStayBounded fills the templates past their bound: they keep
// templatesSize shapes, the most recently used among them.
func TestTemplatesStayBounded(t *testing.T) {
	t.Cleanup(templates.Clear)
	base := testBootstrap(t)
	shape := func(i int) Bootstrap {
		b := base
		b.Paths = []string{"/srv/" + strconv.Itoa(i)}
		return b
	}
	first := base
	first.Paths = []string{"/first"}
	fill := func(b Bootstrap) {
		t.Helper()
		if _, err := CloudConfig(b); err != nil {
			t.Fatal(err)
		}
	}
	fill(first)
	for i := range templatesSize + 20 {
		fill(shape(i))
		if i%100 == 0 {
			fill(first) // recently used: kept
		}
	}
	if n := templates.Len(); n != templatesSize {
		t.Errorf("%d templates held, want %d", n, templatesSize)
	}
	if _, ok := templates.Get(templateKey(v1alpha1.ModeCloudInit, first)); !ok {
		t.Error("a recently used template was dropped")
	}
	if _, ok := templates.Get(templateKey(v1alpha1.ModeCloudInit, shape(0))); ok {
		t.Error("the least recently used template is still held")
	}
}
