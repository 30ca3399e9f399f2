// Package cloudinit renders the bootstrap guestbackup hands a guest through
// cloud-init, and merges it with a VM's own user-data without altering it.
package cloudinit

import (
	"bufio"
	"bytes"
	"net/textproto"
	"strings"
)

// Format is the kind of a user-data document, as cloud-init tells them apart.
type Format string

// The user-data formats cloud-init knows; see cloud-init's "User data formats".
const (
	FormatEmpty       Format = "empty"
	FormatCloudConfig Format = "cloud-config"         // #cloud-config
	FormatScript      Format = "script"               // #!
	FormatInclude     Format = "include"              // #include, #include-once
	FormatBoothook    Format = "boothook"             // #cloud-boothook
	FormatPartHandler Format = "part-handler"         // #part-handler
	FormatArchive     Format = "cloud-config-archive" // #cloud-config-archive
	FormatJinja       Format = "jinja-template"       // ## template: jinja
	FormatMultipart   Format = "multipart"            // a MIME multipart message
	FormatGzip        Format = "gzip"                 // gzip-compressed, of any of the above
	FormatUnknown     Format = "unknown"
)

// DetectFormat tells what kind of user-data data is, from its first line (or
// its MIME headers, or its gzip magic), the way cloud-init does.
func DetectFormat(data []byte) Format {
	if len(bytes.TrimSpace(data)) == 0 {
		return FormatEmpty
	}
	if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
		return FormatGzip
	}
	firstLine, _, _ := bytes.Cut(data, []byte("\n"))
	first := strings.TrimRight(string(firstLine), "\r")
	lower := strings.ToLower(first)
	switch {
	// cloud-config-archive before cloud-config: one prefixes the other.
	case strings.HasPrefix(lower, "#cloud-config-archive"):
		return FormatArchive
	case strings.HasPrefix(lower, "#cloud-config"):
		return FormatCloudConfig
	case strings.HasPrefix(first, "#!"):
		return FormatScript
	case strings.HasPrefix(lower, "#include"):
		return FormatInclude
	case strings.HasPrefix(lower, "#cloud-boothook"):
		return FormatBoothook
	case strings.HasPrefix(lower, "#part-handler"):
		return FormatPartHandler
	case strings.HasPrefix(lower, "## template:") && strings.Contains(lower, "jinja"):
		return FormatJinja
	}
	if isMultipart(data) {
		return FormatMultipart
	}
	return FormatUnknown
}

// isMultipart reports whether data starts with MIME headers declaring a
// multipart body.
func isMultipart(data []byte) bool {
	header, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(data))).ReadMIMEHeader()
	if err != nil && len(header) == 0 {
		return false
	}
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(header.Get("Content-Type"))), "multipart/")
}
