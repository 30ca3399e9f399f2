package storagecreds

import (
	"strings"
	"testing"
)

func TestCheckGCPKey(t *testing.T) {
	for _, tt := range []struct {
		name, key, wantErr string
	}{
		{name: "a service account key", key: `{"type":"service_account","client_email":"velero@p.iam.gserviceaccount.com","private_key":"-----BEGIN PRIVATE KEY-----\nsecret\n","private_key_id":"1"}`},
		{name: "empty", key: "", wantErr: "it is empty"},
		{name: "not JSON", key: "[default]\naws_access_key_id=x", wantErr: "it is not JSON"},
		{name: "an external account", key: `{"type":"external_account","audience":"x"}`, wantErr: `its type is "external_account"`},
		{name: "no private key", key: `{"type":"service_account","client_email":"a@b"}`, wantErr: "lacks client_email or private_key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckGCPKey([]byte(tt.key))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatal(err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			case err != nil && strings.Contains(err.Error(), "secret"):
				t.Fatalf("error %q quotes the key", err)
			}
		})
	}
}

func TestParseAzure(t *testing.T) {
	file := []byte(`# velero install --secret-file
AZURE_SUBSCRIPTION_ID=sub
AZURE_TENANT_ID=tenant
AZURE_CLIENT_ID = client
AZURE_CLIENT_SECRET="se=cret#1"
AZURE_RESOURCE_GROUP=rg
AZURE_CLOUD_NAME=AzurePublicCloud
export AZURE_STORAGE_ACCOUNT_ACCESS_KEY='a2V5PQ=='
a line without an equals sign
`)
	for _, tt := range []struct {
		name, file, variable string
		want                 AzureCredentials
		wantErr              string
	}{
		{name: "a service principal", file: string(file), want: AzureCredentials{TenantID: "tenant", ClientID: "client", ClientSecret: "se=cret#1"}},
		{name: "the storage account key the BSL names", file: string(file), variable: AzureStorageKey, want: AzureCredentials{StorageKey: "a2V5PQ=="}},
		{name: "a storage key variable the file lacks", file: string(file), variable: "MY_KEY", wantErr: "it has no MY_KEY"},
		{name: "a service principal without its secret", file: "AZURE_TENANT_ID=t\nAZURE_CLIENT_ID=c\n", wantErr: "it lacks AZURE_CLIENT_SECRET"},
		{name: "empty", file: "", wantErr: "it lacks AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAzure([]byte(tt.file), tt.variable)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ParseAzure = %+v, want %+v", got, tt.want)
			}
		})
	}
}
