package storagecreds

import (
	"fmt"
	"strings"

	"gopkg.in/ini.v1"
)

// Keys of an S3 credentials Secret, and the environment variables holding
// their values in the server pod's init container.
const (
	AccessKeyID     = "AWS_ACCESS_KEY_ID"
	SecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	// SessionToken is optional.
	SessionToken = "AWS_SESSION_TOKEN"
)

// loadOptions read a shared credentials file as AWS's own tools do, and as
// this package's hand-written parser did before ini took its place: a '#' or
// ';' inside a value is part of it (secret keys are opaque), a line with no
// '=' is skipped rather than refused, and keys are case-sensitive.
var loadOptions = ini.LoadOptions{
	IgnoreInlineComment: true,
	AllowBooleanKeys:    true,
}

// ParseAWS reads one profile of an AWS shared credentials file, the format of
// Velero's credential Secrets. A profile may be written [x] (credentials
// files) or [profile x] (~/.aws/config); sections naming the same profile
// are read in order, a later value winning.
func ParseAWS(data []byte, profile string) (accessKeyID, secretAccessKey, sessionToken string, err error) {
	file, err := ini.LoadSources(loadOptions, data)
	if err != nil {
		return "", "", "", fmt.Errorf("parse AWS credentials file: %w", err)
	}
	found := false
	for _, section := range file.Sections() {
		name := strings.TrimPrefix(strings.TrimSpace(section.Name()), "profile ")
		if name != profile {
			continue
		}
		found = true
		for key, value := range map[string]*string{
			"aws_access_key_id":     &accessKeyID,
			"aws_secret_access_key": &secretAccessKey,
			"aws_session_token":     &sessionToken,
		} {
			if section.HasKey(key) {
				*value = strings.TrimSpace(section.Key(key).String())
			}
		}
	}
	switch {
	case !found:
		return "", "", "", fmt.Errorf("no profile [%s]", profile)
	case accessKeyID == "" || secretAccessKey == "":
		return "", "", "", fmt.Errorf("profile [%s] lacks aws_access_key_id or aws_secret_access_key", profile)
	}
	return accessKeyID, secretAccessKey, sessionToken, nil
}
