package testbed

import "testing"

// The pod runner expands a container's arguments as the kubelet does, so
// that what the controller escapes reaches the process as it meant.
func TestExpand(t *testing.T) {
	vars := map[string]string{"POD_NAMESPACE": "backup", "KOPIA_PASSWORD": "s3cret", "EMPTY": ""}
	for _, tt := range []struct{ in, want string }{
		{"--namespace=$(POD_NAMESPACE)", "--namespace=backup"},
		{"$(POD_NAMESPACE)/$(KOPIA_PASSWORD)", "backup/s3cret"},
		{"--s3-prefix=leak-$$(KOPIA_PASSWORD)/", "--s3-prefix=leak-$(KOPIA_PASSWORD)/"},
		{"$$$$(KOPIA_PASSWORD)", "$$(KOPIA_PASSWORD)"},
		{"$$$(KOPIA_PASSWORD)", "$s3cret"},
		{"$(UNKNOWN) stays", "$(UNKNOWN) stays"},
		{"$(EMPTY)x", "x"},
		{"unclosed $(KOPIA_PASSWORD", "unclosed $(KOPIA_PASSWORD"},
		{"a $ b $x", "a $ b $x"},
		{"ends with $", "ends with $"},
		{"price: 5$$", "price: 5$"},
		{"", ""},
	} {
		if got := expand(tt.in, vars); got != tt.want {
			t.Errorf("expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
