// Package storagecreds is how storage credentials reach a server pod, shared
// by the controller, which checks them and writes the pod's spec, and the
// server pod, which reads them. It owns the formats of the credentials a
// BSLS can name:
//
//   - S3: the keys of an admin's S3 credentials Secret (also the environment
//     variables the init container gets them in, as AWS's tools name them),
//     and the AWS shared credentials file of Velero's aws credential Secrets;
//   - Google Cloud Storage: the service-account JSON key of Velero's gcp
//     credential Secrets;
//   - Azure Blob Storage: the KEY=VALUE file of Velero's azure credential
//     Secrets (a storage account key, or a service principal), and the
//     environment variables Azure Workload Identity's webhook gives a pod.
//
// It imports no cloud SDK and no Kopia: the controller links it too.
package storagecreds
