// Package units formats quantities for people: the controller's messages
// and the kubectl plugin's tables say sizes the same way.
package units

import "fmt"

// Bytes renders n bytes in binary units with one decimal: 512 B, 45.3 MiB.
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	value, prefix := float64(n)/unit, 0
	for value >= unit && prefix < 5 {
		value /= unit
		prefix++
	}
	return fmt.Sprintf("%.1f %ciB", value, "KMGTPE"[prefix])
}
