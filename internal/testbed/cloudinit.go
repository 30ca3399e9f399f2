package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// ValidateCloudConfig runs Debian's `cloud-init schema` on a cloud-config
// document and returns its verdict: nil when valid, else an error carrying
// cloud-init's own messages.
func ValidateCloudConfig(tb TB, cloudConfig []byte) error {
	tb.Helper()
	tools := MustTools(tb)
	dir := tb.TempDir()
	file := filepath.Join(dir, "user-data")
	if err := os.WriteFile(file, cloudConfig, 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	out, err := Run(context.Background(), time.Minute, dir, nil, tools.CloudInitSchema, "--config-file", file)
	if err != nil {
		return &CloudInitError{Output: out, Err: err}
	}
	return nil
}

// CloudInitError is cloud-init's rejection of a document.
type CloudInitError struct {
	Output string
	Err    error
}

func (e *CloudInitError) Error() string {
	return "cloud-init schema: " + e.Err.Error() + "\n" + e.Output
}

func (e *CloudInitError) Unwrap() error { return e.Err }

// CloudInitPart is a user-data part cloud-init hands to a handler other
// than cloud-config's (scripts, boothooks, includes).
type CloudInitPart struct {
	ContentType string
	Payload     []byte
}

// CloudInitProcess runs user-data through Debian's cloud-init the way a
// booting guest does: its UserDataProcessor splits (and decodes) the parts,
// and its cloud-config part handler merges every cloud-config part, each by
// its Merge-Type. It returns the merged cloud-config cloud-init would run,
// and the other parts.
func CloudInitProcess(tb TB, userData []byte) (cloudConfig []byte, others []CloudInitPart, err error) {
	tb.Helper()
	tools := MustTools(tb)
	// Run checks the tools it runs; this one only lends its modules.
	mustBeGranted(tools.CloudInitSchema)
	dir := tb.TempDir()
	in, script := filepath.Join(dir, "user-data"), filepath.Join(dir, "process.py")
	if err := os.WriteFile(in, userData, 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	if err := os.WriteFile(script, []byte(processUserData), 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	root := filepath.Join(filepath.Dir(tools.CloudInitSchema), "root", "usr", "lib", "python3", "dist-packages")
	out, err := Run(context.Background(), time.Minute, dir, []string{"PYTHONPATH=" + root}, "/usr/bin/python3", script, in, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("cloud-init user-data processing: %w\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "others.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("cloud-init user-data processing wrote no result: %w\n%s", err, out)
	}
	var result struct {
		Others []struct {
			Type    string `json:"type"`
			Payload []byte `json:"payload"`
		} `json:"others"`
	}
	if err := json.Unmarshal(data, &result); err != nil {
		return nil, nil, fmt.Errorf("cloud-init user-data processing result: %w", err)
	}
	for _, o := range result.Others {
		others = append(others, CloudInitPart{ContentType: o.Type, Payload: o.Payload})
	}
	cloudConfig, err = os.ReadFile(filepath.Join(dir, "cloud_config"))
	if err != nil {
		return nil, nil, fmt.Errorf("cloud-init wrote no merged cloud-config: %w", err)
	}
	return cloudConfig, others, nil
}

// RunBootCmd runs what a booting guest runs of userData's bootcmd: the
// string entry that contains marker of the cloud-config Debian's cloud-init
// merges from it (CloudInitProcess), by sh as cloud-init runs a string
// entry, in the folder root with env added. It returns what the command
// printed; an error if no entry contains marker or the command fails.
func RunBootCmd(tb TB, userData []byte, marker, root string, env []string) (string, error) {
	tb.Helper()
	cc, _, err := CloudInitProcess(tb, userData)
	if err != nil {
		return "", err
	}
	var doc struct {
		BootCmd []any `json:"bootcmd"`
	}
	if err := yaml.Unmarshal(cc, &doc); err != nil {
		return "", fmt.Errorf("cloud-init's merged cloud-config: %w", err)
	}
	script := ""
	for _, c := range doc.BootCmd {
		if line, ok := c.(string); ok && strings.Contains(line, marker) {
			script = line
		}
	}
	if script == "" {
		return "", fmt.Errorf("no bootcmd entry with %q in:\n%s", marker, cc)
	}
	path := filepath.Join(tb.TempDir(), "bootcmd.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script), 0o700); err != nil {
		return "", err
	}
	return Run(context.Background(), time.Minute, root, env, "/bin/sh", path)
}

// processUserData drives cloud-init's own user-data code: the processor
// that boots use, and the cloud-config part handler that merges parts. The
// stub paths keep every file it writes in the test's folder; #include URLs
// would be fetched, so tests give none.
const processUserData = `import base64, json, os, sys
from cloudinit import handlers, user_data
from cloudinit.handlers.cloud_config import CloudConfigPartHandler

class Paths:
    def __init__(self, d):
        self.d = d
    def get_ipath(self, name=None):
        return os.path.join(self.d, name or "instance")
    get_ipath_cur = get_ipath
    get_cpath = get_ipath

src, out = sys.argv[1], sys.argv[2]
paths = Paths(out)
msg = user_data.UserDataProcessor(paths).process(open(src, "rb").read())
cc = CloudConfigPartHandler(paths)
cc.handle_part(None, handlers.CONTENT_START, None, None, None, None)
others = []
for part in msg.walk():
    if part.get_content_maintype() == "multipart":
        continue
    ctype = part.get_content_type()
    payload = part.get_payload(decode=True)
    if ctype == "text/cloud-config":
        cc.handle_part(None, ctype, part.get_filename() or "?", payload.decode(), None, dict(part.items()))
    else:
        others.append({"type": ctype, "payload": base64.b64encode(payload).decode()})
cc.handle_part(None, handlers.CONTENT_END, None, None, None, None)
json.dump({"others": others}, open(os.path.join(out, "others.json"), "w"))
`
