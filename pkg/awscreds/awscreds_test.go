package awscreds

import "testing"

func TestParse(t *testing.T) {
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
`)
	for _, tt := range []struct {
		profile, id, secret, token, wantErr string
	}{
		{profile: "default", id: "AKIADEFAULT", secret: "secret/default"},
		{profile: "backup", id: "AKIABACKUP", secret: "secret-backup", token: "token"},
		{profile: "broken", wantErr: "profile [broken] lacks aws_access_key_id or aws_secret_access_key"},
		{profile: "absent", wantErr: "no profile [absent]"},
	} {
		id, secret, token, err := Parse(file, tt.profile)
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
