// Package awscreds is how S3 credentials reach a server pod, shared by the
// controller, which checks them and writes the pod's spec, and the server
// pod, which reads them: the keys of an admin's S3 credentials Secret (also
// the environment variables the init container gets them in, as AWS's tools
// name them), and the AWS shared credentials file of Velero's credential
// Secrets.
package awscreds

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// Keys of an S3 credentials Secret, and the environment variables holding
// their values in the server pod's init container.
const (
	AccessKeyID     = "AWS_ACCESS_KEY_ID"
	SecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	// SessionToken is optional.
	SessionToken = "AWS_SESSION_TOKEN"
)

// Parse reads one profile of an AWS shared credentials file, the format of
// Velero's credential Secrets.
func Parse(data []byte, profile string) (accessKeyID, secretAccessKey, sessionToken string, err error) {
	section := ""
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
			continue
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			// ~/.aws/config writes [profile x]; credentials files write [x].
			section = strings.TrimPrefix(strings.TrimSpace(line[1:len(line)-1]), "profile ")
			found = found || section == profile
			continue
		}
		if section != profile {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "aws_access_key_id":
			accessKeyID = strings.TrimSpace(value)
		case "aws_secret_access_key":
			secretAccessKey = strings.TrimSpace(value)
		case "aws_session_token":
			sessionToken = strings.TrimSpace(value)
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", "", err
	}
	switch {
	case !found:
		return "", "", "", fmt.Errorf("no profile [%s]", profile)
	case accessKeyID == "" || secretAccessKey == "":
		return "", "", "", fmt.Errorf("profile [%s] lacks aws_access_key_id or aws_secret_access_key", profile)
	}
	return accessKeyID, secretAccessKey, sessionToken, nil
}
