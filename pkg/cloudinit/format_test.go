package cloudinit

import (
	"bytes"
	"compress/gzip"
	"testing"
)

func gzipped(s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.String()
}

func TestDetectFormat(t *testing.T) {
	tests := []struct {
		name string
		data string
		want Format
	}{
		{"empty", "", FormatEmpty},
		{"blank", " \n\t\n", FormatEmpty},
		{"cloud-config", "#cloud-config\nhostname: a\n", FormatCloudConfig},
		{"cloud-config with CRLF", "#cloud-config\r\nhostname: a\r\n", FormatCloudConfig},
		{"cloud-config archive", "#cloud-config-archive\n- type: text/cloud-config\n", FormatArchive},
		{"shell script", "#!/bin/sh\necho hi\n", FormatScript},
		{"include", "#include\nhttps://example.invalid/a\n", FormatInclude},
		{"include-once", "#include-once\nhttps://example.invalid/a\n", FormatInclude},
		{"boothook", "#cloud-boothook\n#!/bin/sh\n", FormatBoothook},
		{"part handler", "#part-handler\ndef list_types(): pass\n", FormatPartHandler},
		{"jinja", "## template: jinja\n#cloud-config\n", FormatJinja},
		{"multipart", "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n", FormatMultipart},
		{"multipart, MIME-Version first", "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=XX\n\n--XX\n", FormatMultipart},
		{"single MIME part is not multipart", "Content-Type: text/x-shellscript\n\n#!/bin/sh\n", FormatUnknown},
		{"gzip", gzipped("#cloud-config\n"), FormatGzip},
		{"plain YAML without the header", "hostname: a\n", FormatUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DetectFormat([]byte(tt.data)); got != tt.want {
				t.Fatalf("DetectFormat(%q) = %s, want %s", tt.data, got, tt.want)
			}
		})
	}
}
