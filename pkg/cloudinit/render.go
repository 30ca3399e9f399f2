package cloudinit

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/textproto"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v2"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// boundary separates the parts of a merged payload. Parts are base64
// encoded, and base64 has no '-', so no part can contain it; a fixed
// boundary keeps a rendered payload reproducible.
const boundary = "guestbackup-part-boundary"

// Part file names in a merged payload: cloud-init logs them, and UserPart
// finds the VM's own by its name.
const (
	userPartName = "user-data"
	ourPartName  = "guestbackup.cfg"
)

// mergeHow makes our part append to the VM's own lists (bootcmd) and never
// replace a key the VM's own cloud-config sets.
const mergeHow = "list(append)+dict(no_replace,recurse_list)+str()"

// The cloud-config is encoded by the YAML library itself, not through JSON
// as sigs.k8s.io/yaml does: the webhook renders it on every admission, and
// the JSON round trip tripled its cost.
type cloudConfig struct {
	BootCmd []string `yaml:"bootcmd"`
}

// heredocEnd ends each file's content in the install script; no line of
// the bootstrap's files may be it.
const heredocEnd = "GUESTBACKUP_EOF"

// BootCmdMarker is on the first line of guestbackup's bootcmd entry: what
// tells it from the VM's own entries in the cloud-config cloud-init merges.
const BootCmdMarker = "# guestbackup: install this boot's bootstrap"

// CloudConfig renders the bootstrap as a #cloud-config document whose one
// bootcmd installs the files with their modes and (re)starts the units.
// cloud-init runs bootcmd at every boot, while write_files and runcmd run
// only at an instance's first: KubeVirt's instance-id is the VM's firmware
// UUID, the same at every boot, so only a per-boot module reaches a VM that
// opted in after its first boot, or whose credentials, paths, schedule,
// server or CA changed since. It fills in the template of b's shape (see
// templates) when it can, which is the same document.
func CloudConfig(b Bootstrap) ([]byte, error) {
	doc, err := rendered(v1alpha1.ModeCloudInit, b, func(b Bootstrap) (map[string][]byte, error) {
		doc, err := renderCloudConfig(b)
		return map[string][]byte{v1alpha1.SecretKeyUserData: doc}, err
	})
	if err != nil {
		return nil, err
	}
	return doc[v1alpha1.SecretKeyUserData], nil
}

func renderCloudConfig(b Bootstrap) ([]byte, error) {
	files, err := b.Files()
	if err != nil {
		return nil, err
	}
	var sh strings.Builder
	// A subshell: the VM's own bootcmd lines run in the same script, and
	// ours must neither see nor change their shell's options.
	fmt.Fprintf(&sh, "( %s (credentials generation %d)\n", BootCmdMarker, b.Generation)
	// GUESTBACKUP_ROOT installs under another root, for tests, and
	// starts nothing.
	sh.WriteString("set -eu\numask 077\nroot=${GUESTBACKUP_ROOT:-}\n")
	// put installs stdin as file $1 with mode $2, atomically (created
	// private, then given its mode); with a third argument, without
	// stdin's final newline. Folders it makes get the usual 0755.
	sh.WriteString(`put() { f=$root$1; (umask 022 && mkdir -p "${f%/*}"); if [ $# -gt 2 ]; then c=$(cat); printf '%s' "$c"; else cat; fi >"$f.new"; chmod "$2" "$f.new"; mv -f "$f.new" "$f"; }` + "\n")
	for _, f := range files {
		content := string(f.Content)
		for _, line := range strings.Split(content, "\n") {
			if line == heredocEnd {
				return nil, fmt.Errorf("bootstrap: file %s has a line %q", f.Path, heredocEnd)
			}
		}
		chomp := ""
		if !strings.HasSuffix(content, "\n") {
			content, chomp = content+"\n", " -n"
		}
		fmt.Fprintf(&sh, "put %s %#o%s <<'%s'\n%s%s\n", f.Path, f.Mode, chomp, heredocEnd, content, heredocEnd)
	}
	sh.WriteString(b.activation())
	sh.WriteString(")\n")
	body, err := yaml.Marshal(cloudConfig{BootCmd: []string{sh.String()}})
	if err != nil {
		return nil, fmt.Errorf("encode cloud-config: %w", err)
	}
	header := fmt.Sprintf("#cloud-config\n# guestbackup bootstrap for %s, credentials generation %d, installed at every boot.\n", b.Username, b.Generation)
	return append([]byte(header), body...), nil
}

// contentTypes are the user-data formats a merged payload can carry as
// they are, with the MIME type cloud-init gives each.
var contentTypes = map[Format]string{
	FormatCloudConfig: "text/cloud-config",
	FormatScript:      "text/x-shellscript",
	FormatBoothook:    "text/cloud-boothook",
	FormatInclude:     "text/x-include-url",
}

// ErrCannotMerge is returned by Merge for user-data that cannot carry a
// second part safely; the webhook then uses disk mode.
var ErrCannotMerge = errors.New("user-data cannot be merged")

// CanMerge reports whether a VM's own user-data can be merged with ours.
func CanMerge(userData []byte) bool {
	_, ok := contentTypes[DetectFormat(userData)]
	return ok
}

// Merge returns one MIME multipart user-data holding the VM's own user-data
// byte for byte (base64, so no byte changes in transit) and then ours. The
// VM's part comes first: cloud-init merges cloud-config parts in order, and
// our part's merge type appends to the VM's lists and replaces none of its
// keys.
func Merge(userData, ours []byte) ([]byte, error) {
	format := DetectFormat(userData)
	userType, ok := contentTypes[format]
	if !ok {
		return nil, fmt.Errorf("%w: %s user-data cannot be combined with a second part; use disk mode", ErrCannotMerge, format)
	}
	var b bytes.Buffer
	// Both parts in base64 lines, and room for the headers.
	b.Grow((len(userData)+len(ours))*4/3*78/76 + 1024)
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", boundary)
	w := multipart.NewWriter(&b)
	if err := w.SetBoundary(boundary); err != nil {
		return nil, err
	}
	parts := []struct {
		name, contentType string
		data              []byte
		extra             map[string]string
	}{
		{userPartName, userType, userData, nil},
		{ourPartName, "text/cloud-config", ours, map[string]string{"Merge-Type": mergeHow}},
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", p.contentType+`; charset="utf-8"`)
		h.Set("Content-Transfer-Encoding", "base64")
		h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": p.name}))
		for k, v := range p.extra {
			h.Set(k, v)
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			return nil, fmt.Errorf("write part %s: %w", p.name, err)
		}
		if _, err := pw.Write(base64Lines(p.data)); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	b.WriteString("\n")
	return b.Bytes(), nil
}

// base64Lines is data in base64, in MIME's lines of 76 characters, each
// ended by CRLF.
func base64Lines(data []byte) []byte {
	encoded := make([]byte, base64.StdEncoding.EncodedLen(len(data)))
	base64.StdEncoding.Encode(encoded, data)
	out := make([]byte, 0, len(encoded)+2*(len(encoded)/76+1))
	for len(encoded) > 76 {
		out = append(append(out, encoded[:76]...), '\r', '\n')
		encoded = encoded[76:]
	}
	return append(append(out, encoded...), '\r', '\n')
}

// UserPart returns the VM's own user-data from a payload Merge wrote, byte
// for byte: what the VM gets back when it opts out.
func UserPart(merged []byte) ([]byte, error) {
	parts, err := Parts(merged)
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		if p.Name == userPartName {
			return p.Data, nil
		}
	}
	return nil, fmt.Errorf("no part %q in the merged user-data", userPartName)
}

// Part is one decoded part of a multipart user-data.
type Part struct {
	Name, ContentType string
	Data              []byte
}

// Parts decodes a multipart user-data.
func Parts(data []byte) ([]Part, error) {
	header, body, ok := bytes.Cut(data, []byte("\n\n"))
	if !ok {
		return nil, errors.New("user-data has no MIME header")
	}
	var ct string
	for _, line := range strings.Split(string(header), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "Content-Type") {
			ct = strings.TrimSpace(v)
		}
	}
	mediaType, params, err := mime.ParseMediaType(ct)
	if err != nil || !strings.HasPrefix(mediaType, "multipart/") {
		return nil, fmt.Errorf("user-data is not multipart (Content-Type %q)", ct)
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var parts []Part
	for {
		p, err := r.NextRawPart()
		if errors.Is(err, io.EOF) {
			return parts, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read part %d: %w", len(parts)+1, err)
		}
		raw, err := io.ReadAll(p)
		if err != nil {
			return nil, fmt.Errorf("read part %d: %w", len(parts)+1, err)
		}
		if strings.EqualFold(p.Header.Get("Content-Transfer-Encoding"), "base64") {
			if raw, err = decodeBase64(raw); err != nil {
				return nil, fmt.Errorf("part %d: %w", len(parts)+1, err)
			}
		}
		_, dp, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		parts = append(parts, Part{Name: dp["filename"], ContentType: p.Header.Get("Content-Type"), Data: raw})
	}
}

// decodeBase64 decodes a MIME part's base64, whose lines break with CR and
// LF (which the decoder skips) or, written by others, any white space.
func decodeBase64(raw []byte) ([]byte, error) {
	out := make([]byte, base64.StdEncoding.DecodedLen(len(raw)))
	if n, err := base64.StdEncoding.Decode(out, raw); err == nil {
		return out[:n], nil
	}
	return base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(raw)), ""))
}

// DiskFiles is the disk-mode payload: the bootstrap's files under flat
// names (a Secret's keys), plus install.sh, which the guest's one-time
// unit runs from the mounted disk to put each file in place. It fills in
// the template of b's shape (see templates) when it can, which is the same
// payload.
func DiskFiles(b Bootstrap) (map[string][]byte, error) {
	return rendered(v1alpha1.ModeDisk, b, renderDiskFiles)
}

func renderDiskFiles(b Bootstrap) (map[string][]byte, error) {
	files, err := b.Files()
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	var install bytes.Buffer
	install.WriteString(`#!/bin/sh
# install.sh: puts guestbackup's bootstrap from this disk in place and
# starts it. Run by the guest's guestbackup-disk unit at every boot; safe
# to run again. DESTDIR installs under another root and starts nothing.
set -eu
src=$(dirname "$0")
dest=${DESTDIR:-}
root=$dest
`)
	for _, f := range files {
		key := diskKey(f.Path)
		out[key] = f.Content
		fmt.Fprintf(&install, "install -D -m %s %s \"$dest\"%s\n", strconv.FormatUint(uint64(f.Mode), 8), shellQuote(`$src/`+key), shellQuote(f.Path))
	}
	install.WriteString(b.activation())
	out[v1alpha1.SecretKeyInstall] = install.Bytes()
	return out, nil
}

// diskKey names a file on the disk: its base name, which the bootstrap
// keeps unique.
func diskKey(p string) string {
	return p[strings.LastIndex(p, "/")+1:]
}

// shellQuote quotes s for sh, leaving $src expandable.
func shellQuote(s string) string {
	if rest, ok := strings.CutPrefix(s, "$src/"); ok {
		return `"$src"/'` + rest + `'`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
