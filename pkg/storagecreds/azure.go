package storagecreds

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// Keys of the KEY=VALUE file in Velero's azure credential Secrets that Kopia
// can use: a service principal's, and the conventional name of a storage
// account key (a BSL names its own in config.storageAccountKeyEnvVar).
const (
	AzureTenantID     = "AZURE_TENANT_ID"
	AzureClientID     = "AZURE_CLIENT_ID"
	AzureClientSecret = "AZURE_CLIENT_SECRET"
	AzureStorageKey   = "AZURE_STORAGE_ACCOUNT_ACCESS_KEY"
	// AzureFederatedTokenFile is set, with AzureTenantID and AzureClientID,
	// in every container of a pod that Azure Workload Identity's webhook
	// admits (pod label azure.workload.identity/use: "true").
	AzureFederatedTokenFile = "AZURE_FEDERATED_TOKEN_FILE"
)

// AzureCredentials is what reaches Kopia's Azure Blob Storage: a storage
// account key, or a service principal's tenant, client and secret.
type AzureCredentials struct {
	StorageKey                       string
	TenantID, ClientID, ClientSecret string
}

// ParseAzure reads Velero's azure credentials file: one KEY=VALUE a line,
// '#' comments, values optionally quoted. With storageKeyVariable (the
// BSL's config.storageAccountKeyEnvVar) the file must hold that storage
// account key; without, a service principal. Its errors name keys, never
// values.
func ParseAzure(data []byte, storageKeyVariable string) (AzureCredentials, error) {
	values := map[string]string{}
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			value = value[1 : len(value)-1]
		}
		values[strings.TrimSpace(key)] = value
	}
	if err := lines.Err(); err != nil {
		return AzureCredentials{}, fmt.Errorf("read Azure credentials file: %w", err)
	}
	if storageKeyVariable != "" {
		if values[storageKeyVariable] == "" {
			return AzureCredentials{}, fmt.Errorf("it has no %s (the BSL's config.storageAccountKeyEnvVar names it for the storage account key)", storageKeyVariable)
		}
		return AzureCredentials{StorageKey: values[storageKeyVariable]}, nil
	}
	var missing []string
	for _, key := range []string{AzureTenantID, AzureClientID, AzureClientSecret} {
		if values[key] == "" {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		return AzureCredentials{}, fmt.Errorf("it lacks %s: a service principal needs %s, %s and %s, or set the BSL's config.storageAccountKeyEnvVar to the key holding a storage account key",
			strings.Join(missing, ", "), AzureTenantID, AzureClientID, AzureClientSecret)
	}
	return AzureCredentials{TenantID: values[AzureTenantID], ClientID: values[AzureClientID], ClientSecret: values[AzureClientSecret]}, nil
}
