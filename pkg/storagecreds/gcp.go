package storagecreds

import (
	"encoding/json"
	"errors"
	"fmt"
)

// CheckGCPKey checks that data is what Kopia's Google Cloud Storage needs
// from Velero's gcp credential Secrets: a service account's JSON key (Kopia
// loads it as one, so other credential types, such as an external account's
// configuration, are refused here rather than in the server pod). Its
// errors never quote the key.
func CheckGCPKey(data []byte) error {
	var key struct {
		Type         string `json:"type"`
		ClientEmail  string `json:"client_email"`
		PrivateKey   string `json:"private_key"`
		PrivateKeyID string `json:"private_key_id"`
	}
	if len(data) == 0 {
		return errors.New("it is empty: want a service account's JSON key")
	}
	if err := json.Unmarshal(data, &key); err != nil {
		return errors.New("it is not JSON: want a service account's JSON key")
	}
	switch {
	case key.Type != "service_account":
		return fmt.Errorf("its type is %q: want a service account's JSON key (type service_account)", key.Type)
	case key.ClientEmail == "" || key.PrivateKey == "":
		return errors.New("it lacks client_email or private_key: want a service account's whole JSON key")
	}
	return nil
}
