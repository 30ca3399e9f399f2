package units

import "testing"

func TestBytes(t *testing.T) {
	for _, tt := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {47448064, "45.2 MiB"}, {1 << 30, "1.0 GiB"}, {5 << 50, "5.0 PiB"}, {1 << 62, "4.0 EiB"},
	} {
		if got := Bytes(tt.n); got != tt.want {
			t.Errorf("Bytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
