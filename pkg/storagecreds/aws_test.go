package storagecreds

import "testing"

func TestParseAWS(t *testing.T) {
	file := []byte(`# written by velero install
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = secret/default

[profile backup]
aws_access_key_id=AKIABACKUP
aws_secret_access_key=secret-backup
aws_session_token=token
[broken]
aws_access_key_id=AKIA
[hashes]
aws_access_key_id = AKIAHASH
aws_secret_access_key = se#cret;key
a line without an equals sign
AWS_SESSION_TOKEN = not ours: keys are case-sensitive
[split]
aws_access_key_id = AKIAOLD
[profile split]
aws_access_key_id = AKIASPLIT
aws_secret_access_key = secret-split
`)
	for _, tt := range []struct {
		profile, id, secret, token, wantErr string
	}{
		{profile: "default", id: "AKIADEFAULT", secret: "secret/default"},
		{profile: "backup", id: "AKIABACKUP", secret: "secret-backup", token: "token"},
		{profile: "broken", wantErr: "profile [broken] lacks aws_access_key_id or aws_secret_access_key"},
		{profile: "absent", wantErr: "no profile [absent]"},
		{profile: "hashes", id: "AKIAHASH", secret: "se#cret;key"},
		{profile: "split", id: "AKIASPLIT", secret: "secret-split"},
	} {
		id, secret, token, err := ParseAWS(file, tt.profile)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("profile %s: error = %v, want %q", tt.profile, err, tt.wantErr)
			}
			continue
		}
		if err != nil || id != tt.id || secret != tt.secret || token != tt.token {
			t.Errorf("profile %s = %q, %q, %q, %v", tt.profile, id, secret, token, err)
		}
	}
}
