package cloudinit

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/utils/lru"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// A VM's payload (its cloud-config, or its disk's files) differs from
// another's of the same server, paths, schedule and spread by its
// credentials only. Rendering it (encoding YAML, parsing the CA) is most of
// what an admission costs (BenchmarkCloudConfig), and every first admission
// and rotation has credentials never rendered before; so each shape is
// rendered once, as a template with the credentials cut out, and filled
// in for each VM.
//
// Why a filled template is byte for byte the rendering: the credentials
// enter the payload only as text of their own (a header, lines of a
// script, the files' contents), and the cloud-config's script is one YAML
// literal block, which holds every line as it is, indented, whatever its
// length. So when each credential is of the characters of the stand-ins
// the template was cut with (letters, digits, '-', '_', '.'; fillable),
// every encoder makes the same choices around it, and no validation can
// refuse it (a password of 16 such characters is no line GUESTBACKUP_EOF).
// newTemplate proves the cut for its shape: two renderings with stand-ins
// of different values and lengths must cut into the same text, or the
// shape is rendered whole each time. TestTemplatesRenderExactlyWhatRenderingDoes
// checks it on many random credentials.

// templatesSize bounds the templates kept: one per server, paths,
// schedule, spread and mode in use. A template is a few KiB.
const templatesSize = 256

// templates remembers recent templates by mode and shape
// (Bootstrap.shapeKey), the least recently used making room. A shape whose
// renderings do not cut into one is remembered as nil: rendered whole.
var templates = lru.New(templatesSize)

// credential names what goes in a template's hole.
type credential int

const (
	credUser credential = iota
	credHost
	credPassword
	credGeneration
)

// credentials are a bootstrap's credentials as text, by credential.
type credentials [4]string

// credentialsOf are b's credentials as text.
func credentialsOf(b Bootstrap) credentials {
	user, host, _ := strings.Cut(b.Username, "@")
	return credentials{credUser: user, credHost: host, credPassword: b.Password, credGeneration: strconv.FormatInt(b.Generation, 10)}
}

// standIns are credentials cut out of a template's renderings: valid
// values (Validate), unlike anything else a bootstrap holds, of different
// lengths in the two sets.
var standIns = [2]struct {
	username, password string
	generation         int64
}{
	{"gbstandinuserqx@gbstandinhostqx", "GbStandInPasswordQxQxQx", 7301917391917301},
	{"gbstandinuserqzqzqz@gbstandinhostqzqzqzqz", "GbStandInPasswordQzQzQzQzQzQzQz", 830193931939391930},
}

// fillable are the credentials a template can be filled with: those of
// the stand-ins' characters (a generated password is base64url).
var fillable = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// cutTemplate is a rendering with its credentials cut out: text[0], the
// credential holes[0], text[1], and so on.
type cutTemplate struct {
	text  []string
	holes []credential
}

// fill puts b's credentials in t's holes.
func (t *cutTemplate) fill(b Bootstrap) []byte {
	values := credentialsOf(b)
	n := 0
	for _, s := range t.text {
		n += len(s)
	}
	for _, h := range t.holes {
		n += len(values[h])
	}
	out := make([]byte, 0, n)
	for i, s := range t.text {
		out = append(out, s...)
		if i < len(t.holes) {
			out = append(out, values[t.holes[i]]...)
		}
	}
	return out
}

// canFill is whether b's credentials are valid and of the stand-ins'
// characters; b's other fields are its template's, validated when it was
// rendered.
func (b Bootstrap) canFill() bool {
	user, host, _ := strings.Cut(b.Username, "@")
	return identity.ValidateUsername(b.Username) == nil && len(b.Password) >= 16 &&
		fillable.MatchString(user) && fillable.MatchString(host) && fillable.MatchString(b.Password)
}

// payloadTemplate is a payload's template: each document's (a Secret
// key's), by key.
type payloadTemplate map[string]*cutTemplate

// fill is the payload of b, whose shape is t's.
func (t payloadTemplate) fill(b Bootstrap) map[string][]byte {
	out := make(map[string][]byte, len(t))
	for k, doc := range t {
		out[k] = doc.fill(b)
	}
	return out
}

// newTemplate renders b's shape with each set of stand-ins and cuts the
// renderings; nil when they do not cut into the same template.
func newTemplate(b Bootstrap, render func(Bootstrap) (map[string][]byte, error)) (payloadTemplate, error) {
	var cut [2]payloadTemplate
	for i, s := range standIns {
		b.Username, b.Password, b.Generation = s.username, s.password, s.generation
		rendered, err := render(b)
		if err != nil {
			return nil, err
		}
		cut[i] = payloadTemplate{}
		for k, doc := range rendered {
			cut[i][k] = cutOut(string(doc), credentialsOf(b))
		}
	}
	if !maps.EqualFunc(cut[0], cut[1], func(a, b *cutTemplate) bool {
		return slices.Equal(a.text, b.text) && slices.Equal(a.holes, b.holes)
	}) {
		return nil, nil //nolint:nilnil // a shape that renders whole each time is no error
	}
	return cut[0], nil
}

// cutOut cuts every occurrence of the stand-ins s out of rendered.
func cutOut(rendered string, s credentials) *cutTemplate {
	t := &cutTemplate{}
	for {
		at, which := -1, credential(0)
		for c, v := range s {
			if i := strings.Index(rendered, v); i >= 0 && (at < 0 || i < at) {
				at, which = i, credential(c)
			}
		}
		if at < 0 {
			t.text = append(t.text, rendered)
			return t
		}
		t.text = append(t.text, rendered[:at])
		t.holes = append(t.holes, which)
		rendered = rendered[at+len(s[which]):]
	}
}

// rendered is the payload of b, by mode (render renders it whole): its
// shape's template filled in when b's credentials can fill one.
func rendered(mode string, b Bootstrap, render func(Bootstrap) (map[string][]byte, error)) (map[string][]byte, error) {
	if !b.canFill() {
		return render(b)
	}
	key := templateKey(mode, b)
	v, ok := templates.Get(key)
	if !ok {
		t, err := newTemplate(b, render)
		if err != nil {
			return nil, err
		}
		templates.Add(key, t)
		v = t
	}
	t := v.(payloadTemplate)
	if t == nil {
		return render(b)
	}
	return t.fill(b), nil
}

// templateKey is the key of the template of b's shape in mode.
func templateKey(mode string, b Bootstrap) string { return mode + "\x00" + b.shapeKey() }

// shapeKey encodes every field of b but its credentials, each prefixed with
// its length, so two different shapes never share a key whatever their
// fields hold.
func (b Bootstrap) shapeKey() string {
	var k strings.Builder
	field := func(s string) {
		k.WriteString(strconv.Itoa(len(s)))
		k.WriteByte(':')
		k.WriteString(s)
	}
	field(b.ServerURL)
	field(string(b.CA))
	field(b.Schedule)
	field(strconv.FormatInt(int64(b.Spread), 10))
	field(strconv.FormatInt(int64(b.RequestPoll), 10))
	field(strconv.Itoa(len(b.Paths)))
	for _, p := range b.Paths {
		field(p)
	}
	if c := b.Client; c != nil {
		field(c.URL)
		field(c.Version)
		// Every entry, so that a bootstrap Validate refuses never shares
		// the key of one it accepted.
		field(strconv.Itoa(len(c.SHA256)))
		for _, arch := range slices.Sorted(maps.Keys(c.SHA256)) {
			field(arch)
			field(c.SHA256[arch])
		}
	}
	return k.String()
}
